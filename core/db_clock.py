"""The database's clock, the one clock every process shares (a worker's own may be off)."""
from __future__ import annotations

from django.db import connections

from core.conf import get_settings
from core.dialects import dialect_for


def database_now_us(using: str | None = None) -> int:
    """The database's clock, µs since the epoch: samples and monitoring periods are placed
    in the one clock every process shares."""
    using = using or get_settings().DATABASE
    d = dialect_for(connections[using], get_settings().SCHEMA)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])  # parameters (none): Django then reads %% as %
        now = d.to_datetime(cursor.fetchone()[0])
    return int(now.timestamp() * 1_000_000)
