"""`sluice records export`: processing records → a Parquet data set, incrementally.

Layout (pipeline.schema): ``<SLUICE_RECORDS_PATH>/date=YYYY-MM-DD/records-<first id>.parquet``,
one file per run and UTC date of ``ended``.  A run:

1. fixes its range: ids above the watermark, below the first record that ended less than
   ``SLUICE_RECORDS_EXPORT_DELAY`` ago (a record whose receive batch may still be
   committing could otherwise get an id below one already exported);
2. streams the range in chunks of :data:`CHUNK` rows (memory stays flat) into hidden
   temporary files (``.records-….tmp``: Spark and pyarrow skip names starting with a dot);
3. renames them into place, then moves the watermark.

A crash before 3. finishes leaves the watermark where it was: the next run starts at the
same first id, so it writes the same file names and replaces whatever the crashed run
renamed — no record is exported twice or skipped.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from core.conf import get_settings
from core.records.location import Location, location
from core.records.models import ExportWatermark, ProcessingRecord
from core.records.writer import now_us
from pipeline import schema

# pyarrow is imported by the functions that write Parquet, not by this module: the CLI
# loads every command group at start, and pyarrow (with pandas) takes half a second.

#: Rows read from the database and written as one Parquet row group at a time.
CHUNK = 50_000
WATERMARK = "records"
#: Database columns in the order of the data set's (pipeline.arrow_schema.RECORD_SCHEMA).
_DB_COLUMNS = ("id", "message_id", "message_type", "queue", "endpoint", "time_sent_us", "started_us",
               "ended_us", "outcome", "attempt")
_MICROS_PER_DAY = 86_400_000_000


@dataclass
class ExportResult:
    exported: int = 0
    #: The watermark after the run.
    last_id: int = 0
    #: The earliest ``ended`` among the exported records (where the job must recompute from).
    earliest_ended: dt.datetime | None = None
    files: list[str] = field(default_factory=list)


def watermark(using: str | None = None) -> int:
    using = using or get_settings().DATABASE
    row = ExportWatermark.objects.using(using).filter(name=WATERMARK).first()
    return row.last_id if row else 0


class Export:
    """One export run, in two steps so a test can stop between them (:meth:`write`, then
    :meth:`commit`); :func:`export_records` runs both."""

    def __init__(self, path: str | None = None, using: str | None = None, delay: float | None = None,
                 chunk: int = CHUNK) -> None:
        settings = get_settings()
        self.using = using or settings.DATABASE
        self.where: Location = location(path or settings.RECORDS_PATH)
        self.delay = settings.RECORDS_EXPORT_DELAY if delay is None else delay
        self.chunk = chunk
        self.first_id = watermark(self.using) + 1
        self.result = ExportResult(last_id=self.first_id - 1)
        self._renames: list[tuple[str, str]] = []

    def _upper_id(self) -> int | None:
        """The last id of the run: just below the first record that ended less than
        ``delay`` ago, else the highest.  Both are index look-ups (recent records are few).

        Why it is safe: a record still uncommitted now belongs to a receive batch that is
        still open, so (if batches commit within ``delay`` of their records' end) every
        record inserted after it has not ended ``delay`` ago either: the run stops before."""
        records = ProcessingRecord.objects.using(self.using)
        cutoff = now_us() - int(self.delay * 1_000_000)
        recent = records.filter(ended_us__gt=cutoff).order_by("id").values_list("id", flat=True).first()
        if recent is not None:
            return recent - 1
        return records.order_by("-id").values_list("id", flat=True).first()

    def write(self) -> ExportResult:
        """Write the run's files under their final names; the watermark is not moved yet."""
        import pyarrow as pa
        import pyarrow.compute as pc

        upper = self._upper_id()
        if upper is None or upper < self.first_id:
            return self.result
        writers: dict[int, tuple[Any, object, str, str]] = {}  # day → (ParquetWriter, stream, tmp, final)
        earliest = None
        last = self.first_id - 1
        conn = connections[self.using]
        qn = conn.ops.quote_name
        # Chunks by id range, not LIMIT: the same SQL on every database, an index range
        # scan each time, and no ORM per-row overhead (this path has to move 100,000s of rows/s).
        select = (f"SELECT {', '.join(qn(c) for c in _DB_COLUMNS)} FROM {qn(ProcessingRecord._meta.db_table)} "
                  f"WHERE {qn('id')} > %s AND {qn('id')} <= %s ORDER BY {qn('id')}")
        try:
            while last < upper:
                with conn.cursor() as cursor:
                    cursor.execute(select, [last, min(upper, last + self.chunk)])
                    rows = cursor.fetchall()
                last = min(upper, last + self.chunk)
                if not rows:  # a gap in the ids (rolled-back batches, identity jumps): skip it whole
                    following = (ProcessingRecord.objects.using(self.using).filter(id__gt=last)
                                 .order_by("id").values_list("id", flat=True).first())
                    last = upper if following is None else max(last, min(upper, following - 1))
                    continue
                table = _to_table(rows)
                self.result.exported += len(rows)
                low = pc.min(table["ended"]).value
                earliest = low if earliest is None else min(earliest, low)
                days = pc.divide(pc.cast(table["ended"], pa.int64()), _MICROS_PER_DAY)
                unique_days = pc.unique(days).to_pylist()
                for day in unique_days:
                    part = table if len(unique_days) == 1 else table.filter(pc.equal(days, day))
                    if day not in writers:
                        writers[day] = self._open(day)
                    writers[day][0].write_table(part, row_group_size=self.chunk)
        finally:
            for writer, stream, _, _ in writers.values():
                writer.close()
                stream.close()
        for _, _, tmp, final in writers.values():
            self.where.fs.move(tmp, final)
            self.result.files.append(final)
        self.result.last_id = upper
        if earliest is not None:
            self.result.earliest_ended = dt.datetime.fromtimestamp(earliest / 1e6, dt.timezone.utc)
        return self.result

    def _open(self, day: int):
        import pyarrow.parquet as pq

        from pipeline.arrow_schema import RECORD_SCHEMA

        date = (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()
        directory = self.where.join(f"{schema.PARTITION}={date}")
        self.where.fs.create_dir(directory, recursive=True)
        name = schema.record_file_name(self.first_id)
        tmp, final = f"{directory}/.{name}.tmp", f"{directory}/{name}"
        stream = self.where.fs.open_output_stream(tmp)
        return pq.ParquetWriter(stream, RECORD_SCHEMA, compression="zstd"), stream, tmp, final

    def commit(self) -> ExportResult:
        """Move the watermark to the last record written (the files are in place)."""
        if self.result.last_id >= self.first_id:
            with transaction.atomic(using=self.using):
                updated = ExportWatermark.objects.using(self.using).filter(name=WATERMARK).update(
                    last_id=self.result.last_id)
                if not updated:
                    ExportWatermark.objects.using(self.using).create(name=WATERMARK, last_id=self.result.last_id)
        return self.result


def _to_table(rows: list[tuple]) -> Any:  # a pyarrow.Table
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
                   chunk: int = CHUNK) -> ExportResult:
    """Export every record above the watermark (see the module docstring)."""
    run = Export(path, using, delay, chunk)
    run.write()
    return run.commit()
