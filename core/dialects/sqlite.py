"""SQLite: the embedded default.

One writer at a time: a receive is ``BEGIN IMMEDIATE`` (Django's
``transaction_mode="IMMEDIATE"`` option, checked at start-up) followed by
``DELETE … RETURNING``, so two receivers can never take the same row.
Timestamps are UTC text ``YYYY-MM-DD HH:MM:SS.SSS``, which sorts as time does.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import time
from typing import Any, Iterator

from core.dialects.base import Dialect
from core.dialects.limits_sql import LimitsSQL
from core.dialects.delayed_sql import DelayedSQL
from core.dialects.dashboard_sql import DashboardSQL
from core.dialects.failed_counts_sql import SQLiteFailedCountsSQL
from core.dialects.outbox_sql import OutboxSQL
from core.dialects.tasks_sql import TaskSQL


class SQLiteDialect(TaskSQL, DelayedSQL, OutboxSQL, DashboardSQL, SQLiteFailedCountsSQL, LimitsSQL, Dialect):
    one_second_ago = "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1 seconds')"
    vendor = "sqlite"
    supports_concurrent_writers = False
    supports_schemas = False
    rowversion_is_primary_key = True
    limit = " LIMIT %s"
    byte_length_function = "LENGTH"
    # One writer at a time (BEGIN IMMEDIATE) and readers that never block: no hints, no row locks.
    readpast_hint = nolock_hint = lock_skip_hint = skip_locked_suffix = ""
    max_parameters = 30_000
    # SQLITE_BUSY and SQLITE_LOCKED (primary codes): another writer held the database
    # past the busy timeout.
    transient_errors = frozenset({"5", "6"})
    # SQLite reports a missing table as a generic SQLITE_ERROR (1): only its text tells.
    missing_table_errors = frozenset({"no such table"})

    #: SQLITE_INTERRUPT: the progress handler of :meth:`bounded` stopped the statement.
    statement_timeout_errors = frozenset({"9"})

    @contextlib.contextmanager
    def bounded(self, connection: Any, seconds: float) -> Iterator[None]:
        # No statement timeout in SQLite: a progress handler, called every 10,000 virtual
        # machine steps, interrupts the running statement once the deadline has passed.
        connection.ensure_connection()
        raw = connection.connection
        deadline = time.monotonic() + seconds
        raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            yield
        finally:
            raw.set_progress_handler(None, 0)

    def error_codes(self, exc: BaseException) -> set[str]:
        code = getattr(exc, "sqlite_errorcode", None)  # sqlite3 errors (Python 3.11+)
        codes = {str(code & 0xFF)} if isinstance(code, int) else set()
        if isinstance(code, int) and str(exc).startswith("no such table"):
            codes.add("no such table")
        return codes

    def create_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.index_names(name)
        return [
            (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                '"Id" TEXT NOT NULL, '
                '"CorrelationId" TEXT NULL, '
                '"ReplyToAddress" TEXT NULL, '
                '"Recoverable" INTEGER NOT NULL DEFAULT 1, '
                '"Expires" TEXT NULL, '
                '"Headers" TEXT NOT NULL, '
                '"Body" BLOB NULL, '
                # AUTOINCREMENT: RowVersion never goes back, even after the newest row is deleted.
                '"RowVersion" INTEGER PRIMARY KEY AUTOINCREMENT)',
                [],
            ),
            (
                f'CREATE INDEX IF NOT EXISTS {self.quote(idx["expires"])} ON {t} ("Expires") '
                'WHERE "Expires" IS NOT NULL',
                [],
            ),
        ]

    def drop_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        return [(f"DROP TABLE IF EXISTS {self.table(name)}", [])]

    def existing_indexes(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [name])

    def table_exists(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [name])

    def now_sql(self) -> str:
        # %% because Django formats the statement with its parameters.
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"

    def expires_after_ttl_sql(self) -> str:
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def ttl_params(self, ttl_seconds: float) -> list[Any]:
        return [f"+{ttl_seconds:.3f} seconds"]

    def datetime_param(self, value: dt.datetime | None) -> Any:
        if value is None:
            return None
        return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]

    def receive(self, name: str) -> str:
        t = self.table(name)
        return (
            f'DELETE FROM {t} WHERE "RowVersion" IN '
            f'(SELECT "RowVersion" FROM {t} ORDER BY "RowVersion" LIMIT %s) '
            f"RETURNING {self._message_columns()}, {self.expired_sql()}"
        )

    def delete_by_id(self, name: str) -> str:
        return f'DELETE FROM {self.table(name)} WHERE "Id" = %s'

    def purge_expired(self, name: str) -> str:
        t = self.table(name)
        return (
            f'DELETE FROM {t} WHERE "RowVersion" IN (SELECT "RowVersion" FROM {t} '
            f'WHERE "Expires" IS NOT NULL AND "Expires" <= {self.now_sql()} LIMIT %s)'
        )

    def purge_all(self, name: str) -> str:
        t = self.table(name)
        return f'DELETE FROM {t} WHERE "RowVersion" IN (SELECT "RowVersion" FROM {t} LIMIT %s)'

    # -- delayed-message store -------------------------------------------------
    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        return [
            (f"CREATE TABLE IF NOT EXISTS {t} ("
             '"Id" TEXT NOT NULL PRIMARY KEY, "Destination" TEXT NOT NULL, "State" BLOB NULL, '
             '"Time" TEXT NOT NULL, "Headers" TEXT NOT NULL, "RetryCount" INTEGER NOT NULL DEFAULT 0)', []),
            (f'CREATE INDEX IF NOT EXISTS {self.quote(self.delayed_time_index(name))} ON {t} ("Time")', []),
        ]

    # -- outbox -------------------------------------------------------------------
    def create_outbox_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.outbox_index_names(name)
        return [
            (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                '"MessageId" TEXT NOT NULL PRIMARY KEY, '
                '"Dispatched" INTEGER NOT NULL DEFAULT 0, '
                '"DispatchedAt" TEXT NULL, '
                '"PersistenceVersion" TEXT NOT NULL, '
                '"Operations" TEXT NOT NULL, '
                '"CreatedAt" TEXT NOT NULL, '
                '"Quarantined" INTEGER NOT NULL DEFAULT 0, '
                '"LastError" TEXT NULL)',
                [],
            ),
            (f'CREATE INDEX IF NOT EXISTS {self.quote(idx["dispatched_at"])} ON {t} ("DispatchedAt") '
             'WHERE "Dispatched" = 1', []),
            (f'CREATE INDEX IF NOT EXISTS {self.quote(idx["undispatched"])} ON {t} ("CreatedAt") '
             'WHERE "Dispatched" = 0', []),
        ]

    def before_now_sql(self) -> str:
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"

    def before_now_params(self, seconds: float) -> list[Any]:
        return [f"-{seconds:.3f} seconds"]

    def outbox_cleanup(self, name: str) -> str:
        t = self.table(name)
        return (
            f'DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE "Dispatched" = 1 '
            f'AND "DispatchedAt" <= {self.before_now_sql()} LIMIT %s)'
        )

    def outbox_size(self, name: str) -> tuple[str, list[Any]]:
        # dbstat (compiled into most SQLite builds) reports pages; without it the caller
        # falls back to outbox_data_size().
        idx = self.outbox_index_names(name)
        return ("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN (%s, %s, %s, %s)",
                [name, idx["dispatched_at"], idx["undispatched"], f"sqlite_autoindex_{name}_1"])

    # -- outbox phase-2 lease (core-b; see Dialect.outbox_claim_lease) -------------------
    def outbox_column_exists(self, name: str, column: str) -> tuple[str, list[Any]]:
        return ("SELECT 1 FROM pragma_table_info(%s) WHERE name = %s", [name, column])

    def outbox_add_column(self, name: str, column: str) -> str:
        return f"ALTER TABLE {self.table(name)} ADD COLUMN {self.quote(column)} TEXT NULL"

    def outbox_claim_lease(self, name: str, count: int, include_quarantined: bool = False) -> str:
        # No row locks: the claim's transaction began with BEGIN IMMEDIATE (the only writer).
        return (f'UPDATE {self.table(name)} SET "DispatchingUntil" = {self.expires_after_ttl_sql()}, '
                '"DispatchToken" = %s '
                f"WHERE {self._claim_where(count, include_quarantined)} AND {self._lease_free()} "
                f'RETURNING "MessageId", "Operations", "CreatedAt", {self.now_sql()}')
