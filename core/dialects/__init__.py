"""Every database difference Sluice knows, in one package.

A dialect is a set of capability flags plus named SQL (statements with ``%s``
placeholders, as Django's cursors take them).  The engine asks the dialect for a
statement by name and never looks at the vendor itself; :func:`dialect_for` is
the one place a vendor string is read.
"""
from __future__ import annotations

from functools import lru_cache

from core.dialects.base import Dialect
from core.dialects.rows import Row
from core.dialects.outbox_sql import OutboxRow
from core.dialects.mssql import MSSQLDialect
from core.dialects.postgresql import PostgreSQLDialect
from core.dialects.sqlite import SQLiteDialect

__all__ = ["Dialect", "OutboxRow", "Row", "dialect_for", "DIALECTS"]

# Django's ``connection.vendor`` → dialect.  mssql-django calls itself "microsoft".
DIALECTS: dict[str, type[Dialect]] = {
    "sqlite": SQLiteDialect,
    "postgresql": PostgreSQLDialect,
    "microsoft": MSSQLDialect,
}


@lru_cache(maxsize=None)
def _dialect(vendor: str, schema: str | None) -> Dialect:
    try:
        return DIALECTS[vendor](schema=schema)
    except KeyError:
        raise LookupError(
            f"Sluice has no dialect for database vendor {vendor!r}; "
            f"supported: {', '.join(sorted(DIALECTS))}"
        ) from None


def dialect_for(connection, schema: str | None = None) -> Dialect:
    """The dialect for a Django connection (cached per vendor and schema)."""
    return _dialect(connection.vendor, schema)
