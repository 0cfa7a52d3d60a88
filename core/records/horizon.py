"""The export's horizon: the point below which no record id can still appear.

Record ids come from the database's sequence in the order receive batches *insert*, but
batches *commit* in any order: an id below one already visible may belong to a batch
still open.  Exporting past it and moving the watermark would pass that record over for
good.  So an export takes a horizon — the highest visible id, plus what it needs to tell
later that every transaction open at that moment has ended — and a later export treats
every id at or below a *settled* horizon as final (committed, or never will be).  Above
it, only an unbroken run of visible ids is final.

When a horizon settles depends on the database (core.dialects, ``supports_commit_snapshots``):
- PostgreSQL: exactly when every transaction of this database open at the horizon has ended
  (other databases' transactions on the same server are not waited for);
- one writer at a time (SQLite): at once — batches commit in id order;
- otherwise (SQL Server): after ``SLUICE_RECORDS_EXPORT_DELAY`` seconds of the exporter's
  clock, which must exceed the longest receive transaction.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from core.queues import dialect
from core.models.records import ExportWatermark, ProcessingRecord
from core.records.writer import now_us


@dataclass(frozen=True)
class Horizon:
    #: The highest id visible when it was taken (None: no horizon, or an empty table).
    id: int | None = None
    token: str = ""
    taken_us: int | None = None

    @classmethod
    def of(cls, row: ExportWatermark) -> Horizon:
        return cls(row.horizon_id, row.horizon_token, row.horizon_us)


def take(using: str) -> Horizon:
    """The highest visible record id now, with what :func:`settled` needs later."""
    conn = connections[using]
    with conn.cursor() as cursor:
        cursor.execute(dialect(using).record_horizon(conn.ops.quote_name(ProcessingRecord._meta.db_table)))
        highest, token = cursor.fetchone()
    # The clock is read after the statement: the horizon is never dated earlier than it was taken.
    return Horizon(highest, token or "", now_us())


def settled(horizon: Horizon, using: str, delay: float) -> bool:
    """True when no transaction open when ``horizon`` was taken can still commit."""
    if horizon.id is None:
        return True
    d = dialect(using)
    if not d.supports_concurrent_writers:
        return True
    if d.supports_commit_snapshots and horizon.token:
        with connections[using].cursor() as cursor:
            cursor.execute(d.horizon_settled(), [horizon.token])
            return bool(cursor.fetchone()[0])
    return now_us() - (horizon.taken_us or 0) >= delay * 1_000_000
