"""`sluice records export`: processing records → a Parquet data set, incrementally.

Layout (pipeline.schema): ``<SLUICE_RECORDS_PATH>/date=YYYY-MM-DD/records-<first id>.parquet``,
one file per run and UTC date of ``ended``.  A run, under the ``pipeline`` lease (one
export or pipeline run at a time anywhere):

1. fixes its last id, the *cut*: every id at or below it is final, so the watermark can
   pass it (core.records.horizon: ids at or below a settled horizon, then as long as the
   visible ids run on without a hole — a hole may be a receive batch still committing);
2. streams the range in chunks of :data:`CHUNK` rows (memory stays flat) into hidden
   temporary files (``.records-….<run>.tmp``: Spark and pyarrow skip names starting with
   a dot; the run's own tag, so two writers never share one);
3. renames them into place, then moves the watermark — only if it is still where the run
   found it (compare-and-set: a run that lost the race fails instead of overwriting).

A crash before 3. finishes leaves the watermark where it was: the next run starts at the
same first id, so it writes the same file names and replaces whatever the crashed run
renamed.  The Spark job also drops a record id it meets twice (pipeline.job).

Each data set has its own watermark: ``--path`` elsewhere than ``SLUICE_RECORDS_PATH``
exports to that copy without moving the real data set's (which retention relies on).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connections, transaction

from core.conf import get_settings
from core.runtime.lease import Lease
from core.models import Lease as LeaseRecord
from core.records import horizon
from core.records.extra import require
from core.records.location import Location, location
from core.models.records import ExportWatermark, ProcessingRecord
from pipeline import schema

# pyarrow is imported by the functions that write Parquet, not by this module: the CLI
# loads every command group at start, and pyarrow (with pandas) takes half a second.

#: Rows read from the database and written as one Parquet row group at a time.
CHUNK = 50_000
#: The watermark of the data set at SLUICE_RECORDS_PATH (the one retention and the pipeline use).
WATERMARK = "records"
#: The lease one export or pipeline run holds at a time (core.records.run takes it too).
LEASE = "pipeline"
#: The lease outlives a stuck run by this much; each stage renews it.
LEASE_SECONDS = 1800.0
#: Database columns in the order of the data set's (pipeline.arrow_schema.RECORD_SCHEMA).
_DB_COLUMNS = ("id", "message_id", "message_type", "queue", "endpoint", "time_sent_us", "started_us",
               "ended_us", "outcome", "attempt", "deliver_at_us")
_MICROS_PER_DAY = 86_400_000_000


class ExportBusy(Exception):
    """Another export or pipeline run holds the ``pipeline`` lease."""


class LeaseLost(Exception):
    """The run's lease lapsed and another run may have taken it: this one stops before it writes."""


class ExportConflict(Exception):
    """The watermark moved while this run exported: another run got there first."""


@dataclass
class ExportResult:
    exported: int = 0
    #: The watermark after the run.
    last_id: int = 0
    #: The earliest ``ended`` among the exported records (where the job must recompute from).
    earliest_ended: dt.datetime | None = None
    files: list[str] = field(default_factory=list)
    #: Committed records above the cut, left for a later run, and the id they wait for.
    held_back: int = 0
    waiting_for: int | None = None

    @property
    def held_reason(self) -> str:
        if not self.held_back:
            return ""
        return (f"record id {self.waiting_for} is not visible yet: a receive batch that may still commit "
                f"holds it, so the {self.held_back} record(s) after it wait for the next export")


def watermark_name(where: Location) -> str:
    """The watermark's name for the data set at ``where``."""
    if where.spark_uri == location(get_settings().RECORDS_PATH).spark_uri:
        return WATERMARK
    return "records@" + hashlib.sha256(where.spark_uri.encode()).hexdigest()[:40]


def watermark(using: str | None = None, name: str = WATERMARK) -> int:
    using = using or get_settings().DATABASE
    row = ExportWatermark.objects.using(using).filter(name=name).first()
    return row.last_id if row else 0


def _watermark_row(using: str, name: str) -> ExportWatermark:
    try:
        with transaction.atomic(using=using):
            row, _ = ExportWatermark.objects.using(using).get_or_create(name=name)
    except IntegrityError:  # created by another process between the look-up and the insert
        row = ExportWatermark.objects.using(using).get(name=name)
    return row


class Export:
    """One export run, in two steps so a test can stop between them (:meth:`write`, then
    :meth:`commit`); :func:`export_records` runs both under the lease."""

    def __init__(self, path: str | None = None, using: str | None = None, delay: float | None = None,
                 chunk: int = CHUNK, lease: Lease | None = None) -> None:
        require("pyarrow")
        settings = get_settings()
        self.using = using or settings.DATABASE
        self.where: Location = location(path or settings.RECORDS_PATH)
        self.delay = settings.RECORDS_EXPORT_DELAY if delay is None else delay
        self.chunk = chunk
        self.lease = lease
        self.name = watermark_name(self.where)
        self.state = _watermark_row(self.using, self.name)
        self.first_id = self.state.last_id + 1
        self.result = ExportResult(last_id=self.first_id - 1)
        self.horizon = horizon.Horizon.of(self.state)  # stored by commit()
        self._tag = uuid.uuid4().hex[:12]
        self._writers: dict[int, tuple[Any, object, str, str]] = {}  # day → (ParquetWriter, stream, tmp, final)

    def write(self) -> ExportResult:
        """Write the run's files under their final names; the watermark is not moved yet."""
        old = horizon.Horizon.of(self.state)
        old_settled = horizon.settled(old, self.using, self.delay)
        fresh = horizon.take(self.using)
        # Final without looking: every id up to a settled horizon, and what is exported.
        # The fresh one is settled at once with one writer at a time, or when no transaction
        # was open (PostgreSQL); else it is the next run's — unless an older one is pending.
        final = self.first_id - 1
        if old_settled:
            final = max(final, old.id or 0)
            self.horizon = fresh
        if horizon.settled(fresh, self.using, self.delay):
            final = max(final, fresh.id or 0)
            self.horizon = horizon.Horizon()
        upper = fresh.id
        if upper is None or upper < self.first_id:
            return self.result
        try:
            cut = self._stream(min(final, upper), upper)
        finally:
            for writer, stream, _, _ in self._writers.values():
                writer.close()
                stream.close()
        self._check_lease()
        for _, _, tmp, final_name in self._writers.values():
            self.where.fs.move(tmp, final_name)
            self.result.files.append(final_name)
        self.result.last_id = cut
        if cut < upper:
            self.result.waiting_for = cut + 1
            self.result.held_back = ProcessingRecord.objects.using(self.using).filter(id__gt=cut).count()
        return self.result

    def _stream(self, final: int, upper: int) -> int:
        """Write ids from the first one on while they are final; returns the cut."""
        import pyarrow as pa
        import pyarrow.compute as pc

        conn = connections[self.using]
        qn = conn.ops.quote_name
        # Chunks by id range, not LIMIT: the same SQL on every database, an index range
        # scan each time, and no ORM per-row overhead (this path has to move 100,000s of rows/s).
        select = (f"SELECT {', '.join(qn(c) for c in _DB_COLUMNS)} FROM {qn(ProcessingRecord._meta.db_table)} "
                  f"WHERE {qn('id')} > %s AND {qn('id')} <= %s ORDER BY {qn('id')}")
        last = self.first_id - 1  # every id up to here is exported or final
        while last < upper:
            high = min(upper, last + self.chunk)
            with conn.cursor() as cursor:
                cursor.execute(select, [last, high])
                rows = cursor.fetchall()
            if not rows:  # a hole: skip it whole while it is final, else stop before it
                following = (ProcessingRecord.objects.using(self.using).filter(id__gt=last)
                             .order_by("id").values_list("id", flat=True).first())
                if following is None or following - 1 > final:
                    return max(last, final)
                last = following - 1
                continue
            table = _to_table(rows)
            hole = _first_hole(table["id"], last, final)
            if hole is not None:
                table = table.slice(0, hole)
            if table.num_rows:
                self._add(table, pa, pc)
            if hole is not None:
                # The missing id is one above the last exported (or final) id.
                return max(last if not table.num_rows else table["id"][-1].as_py(), final)
            last = high
        return upper

    def _add(self, table: Any, pa: Any, pc: Any) -> None:
        self.result.exported += table.num_rows
        low = dt.datetime.fromtimestamp(pc.min(table["ended"]).value / 1e6, dt.timezone.utc)
        if self.result.earliest_ended is None or low < self.result.earliest_ended:
            self.result.earliest_ended = low
        days = pc.divide(pc.cast(table["ended"], pa.int64()), _MICROS_PER_DAY)
        unique_days = pc.unique(days).to_pylist()
        for day in unique_days:
            part = table if len(unique_days) == 1 else table.filter(pc.equal(days, day))
            if day not in self._writers:
                self._writers[day] = self._open(day)
            self._writers[day][0].write_table(part, row_group_size=self.chunk)

    def _open(self, day: int):
        import pyarrow.parquet as pq

        from pipeline.arrow_schema import RECORD_SCHEMA

        date = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
        directory = self.where.join(f"{schema.PARTITION}={date}")
        self.where.fs.create_dir(directory, recursive=True)
        name = schema.record_file_name(self.first_id)
        tmp, final = f"{directory}/.{name}.{self._tag}.tmp", f"{directory}/{name}"
        stream = self.where.fs.open_output_stream(tmp)
        return pq.ParquetWriter(stream, RECORD_SCHEMA, compression="zstd"), stream, tmp, final

    def _check_lease(self) -> None:
        if self.lease is not None and not still_held(self.lease):
            raise LeaseLost(f"lease {self.lease.name!r} lapsed during the export: stopped before renaming "
                            f"its files into place (nothing changed)")

    def commit(self) -> ExportResult:
        """Move the watermark to the cut (the files are in place), store the horizon, and —
        for the pipeline's data set — remember where the windows must be recomputed from."""
        self._check_lease()
        updates: dict[str, Any] = {"last_id": self.result.last_id, "horizon_id": self.horizon.id,
                                   "horizon_token": self.horizon.token, "horizon_us": self.horizon.taken_us}
        if self.result.earliest_ended is not None:
            earliest = int(self.result.earliest_ended.timestamp() * 1_000_000)
            pending = self.state.pending_since_us
            updates["pending_since_us"] = earliest if pending is None else min(pending, earliest)
        with transaction.atomic(using=self.using):
            moved = ExportWatermark.objects.using(self.using).filter(
                name=self.name, last_id=self.first_id - 1).update(**updates)
        if not moved:
            raise ExportConflict(f"watermark {self.name!r} moved during this export (another export ran at "
                                 f"once): this run's {self.result.exported} record(s) are left to it")
        return self.result


def still_held(lease: Lease) -> bool:
    """Renew ``lease`` and confirm in the database that nobody took it over meanwhile
    (Lease.acquire skips the round trip right after a renewal: not enough before a write)."""
    return lease.acquire() and LeaseRecord.objects.using(lease.using).filter(
        name=lease.name, holder=lease.holder).exists()


def _first_hole(ids: Any, previous: int, final: int) -> int | None:
    """The index of the first id above ``final`` that does not follow the one before it
    (``previous`` before the first), or None."""
    import pyarrow as pa
    import pyarrow.compute as pc

    before = pa.concat_arrays([pa.array([previous], pa.int64()), ids.combine_chunks().slice(0, len(ids) - 1)])
    expected = pc.add(pc.max_element_wise(before, pa.scalar(final, pa.int64())), 1)
    broken = pc.and_(pc.greater(ids, final), pc.not_equal(ids, expected))
    index = pc.index(broken, True).as_py()
    return None if index < 0 else index


def _to_table(rows: list[tuple]) -> Any:  # a pyarrow.Table
    # pyarrow comes with the [pipeline] extra: imported only when an export writes a file,
    # so a plain install imports this module (core.records.extra.require says what to install).
    import pyarrow as pa

    from pipeline.arrow_schema import RECORD_SCHEMA, TIMESTAMP

    columns = list(zip(*rows))
    arrays = []
    for f, values in zip(RECORD_SCHEMA, columns):
        if f.type == TIMESTAMP:
            arrays.append(pa.array(values, pa.int64()).cast(TIMESTAMP))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=RECORD_SCHEMA)


def export_records(path: str | None = None, using: str | None = None, delay: float | None = None,
                   chunk: int = CHUNK, lease: Lease | None = None) -> ExportResult:
    """Export every final record above the watermark (see the module docstring), under
    ``lease`` (a pipeline run's) or the ``pipeline`` lease taken here."""
    require("pyarrow")
    using = using or get_settings().DATABASE
    own = lease is None
    if own:
        lease = Lease(LEASE, LEASE_SECONDS, using)
        if not lease.acquire():
            raise ExportBusy("another export or pipeline run is in progress (lease 'pipeline' held)")
    try:
        run = Export(path, using, delay, chunk, lease)
        run.write()
        return run.commit()
    finally:
        if own:
            lease.release()
