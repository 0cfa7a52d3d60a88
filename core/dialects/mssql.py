"""SQL Server (mssql-django): the layout and locking of the NServiceBus SQL transport.

- The queue table is a heap with a *nonclustered* RowVersion index (a clustered one
  caused latch contention on the last page under concurrent inserts).
- Receive: ``DELETE TOP(n)`` through a CTE ``WITH (UPDLOCK, READPAST, ROWLOCK)``,
  ``OUTPUT deleted.*`` — the lowest RowVersions no other receiver holds.
- Index names are per table, so they are the transport's own ``Index_RowVersion`` /
  ``Index_Expires``: a table made by a .NET endpoint passes the missing-index check.
- ``sp_getapplock`` serialises Sluice's DDL across processes.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any

from core.dialects.base import Dialect
from core.dialects.limits_sql import LimitsSQL
from core.dialects.delayed_sql import DELAYED_COLUMNS, DelayedSQL
from core.dialects.dashboard_sql import DashboardSQL
from core.dialects.failed_counts_sql import MSSQLFailedCountsSQL
from core.dialects.outbox_sql import MSSQLOutboxSQL
from core.dialects.tasks_sql import MSSQLTaskSQL


class MSSQLDialect(MSSQLTaskSQL, DelayedSQL, MSSQLOutboxSQL, DashboardSQL, MSSQLFailedCountsSQL, LimitsSQL, Dialect):
    one_second_ago = "DATEADD(second, -1, GETUTCDATE())"
    vendor = "microsoft"
    # OFFSET … FETCH rather than TOP (%s): the limit stays the last parameter, as LIMIT's.
    limit = " OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY"
    byte_length_function = "DATALENGTH"
    readpast_hint = " WITH (READPAST)"
    nolock_hint = " WITH (NOLOCK)"
    # The receive's hints (and the ORM's select_for_update(skip_locked=True)).
    lock_skip_hint = " WITH (UPDLOCK, READPAST, ROWLOCK)"
    skip_locked_suffix = ""
    # No cross-process wake-up here: movers poll for newly stored early messages.
    wake_poll_interval = 1.0
    # SQL Server refuses a statement with more than 2,100 parameters; keep a margin for
    # the few fixed ones a statement carries besides its list.
    max_parameters = 2_000
    # counts() reads WITH (NOLOCK): an operator's view must not wait behind receivers.
    counts_are_exact = False
    # 1205 deadlock victim, 1222 lock request time-out, 3960 snapshot update conflict,
    # 40001 / HYT00 / 08S01 (SQLSTATEs: serialization, timeout, link failure), and the
    # Azure SQL "try again" errors 40197, 40501, 40613.
    transient_errors = frozenset({"1205", "1222", "3960", "40001", "HYT00", "08S01", "40197", "40501", "40613"})
    missing_table_errors = frozenset({"208"})  # Invalid object name

    #: 1222: lock request time out; HYT00: the driver's query timeout.
    statement_timeout_errors = frozenset({"1222", "HYT00"})
    # A deleted row stays a ghost record until the ghost cleanup takes it, which waits for
    # row versions a snapshot may still read (READ_COMMITTED_SNAPSHOT, a long transaction).
    supports_receive_mark = True

    def statement_timeout(self, seconds: float) -> tuple[str, list[Any]]:
        # SQL Server has no server-side limit on a statement's run time (that is the driver's
        # query timeout); what makes a dashboard read hang is waiting for locks, so bound that.
        return (f"SET LOCK_TIMEOUT {max(int(seconds * 1000), 1)}", [])

    def statement_timeout_reset(self) -> tuple[str, list[Any]]:
        return ("SET LOCK_TIMEOUT -1", [])  # wait for ever, the default

    def error_codes(self, exc: BaseException) -> set[str]:
        # pyodbc / mssql-python: args = (SQLSTATE, "[SQLSTATE] [driver]… message (number) (SQLExecDirectW)").
        codes: set[str] = set()
        for arg in getattr(exc, "args", ()):
            if not isinstance(arg, str):
                continue
            if re.fullmatch(r"[0-9A-Z]{5}", arg):
                codes.add(arg)
            codes.update(re.findall(r"\((\d{3,5})\)", arg))
        return codes

    def quote(self, name: str) -> str:
        return "[" + name.replace("]", "]]") + "]"

    def table(self, name: str) -> str:
        return f"{self.quote(self.schema or 'dbo')}.{self.quote(name)}"

    def index_names(self, name: str) -> dict[str, str]:
        return {"rowversion": "Index_RowVersion", "expires": "Index_Expires"}

    def delayed_time_index(self, name: str) -> str:
        return "Index_Time"

    def ddl_lock(self) -> tuple[str, list[Any]]:
        # A Transaction-owned applock needs @@TRANCOUNT > 0.  Django's atomic() turns
        # ODBC autocommit off, which the SQL Server driver does with
        # SET IMPLICIT_TRANSACTIONS ON: the transaction opens only at the first
        # SELECT/INSERT/CREATE/…, and DECLARE/EXEC are not among those, so as the
        # first statement of a block sp_getapplock would see no transaction and
        # fail (-999, msg 15626).  In implicit mode BEGIN TRANSACTION opens two
        # levels; the COMMIT closes the explicit one and leaves the implicit one
        # open for Django to commit.  In autocommit mode the pair is a no-op and the
        # lock still fails loudly, as it should outside a transaction.
        return (
            "DECLARE @r int; "
            "IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 2 BEGIN BEGIN TRANSACTION; COMMIT TRANSACTION; END; "
            "EXEC @r = sp_getapplock @Resource = N'sluice:ddl', "
            "@LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = 60000; "
            "IF @r < 0 THROW 51000, 'Sluice: could not take the DDL lock', 1;",
            [],
        )

    def create_schema(self) -> list[tuple[str, list[Any]]]:
        if not self.schema:
            return []
        return [("IF SCHEMA_ID(%s) IS NULL EXEC('CREATE SCHEMA ' + %s)", [self.schema, self.quote(self.schema)])]

    def create_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.index_names(name)
        return self.create_schema() + [
            (
                "IF OBJECT_ID(%s, N'U') IS NULL "
                f"CREATE TABLE {t} ("
                "[Id] uniqueidentifier NOT NULL, "
                "[CorrelationId] varchar(255) NULL, "
                "[ReplyToAddress] varchar(255) NULL, "
                "[Recoverable] bit NOT NULL, "
                "[Expires] datetime NULL, "
                "[Headers] nvarchar(max) NOT NULL, "
                "[Body] varbinary(max) NULL, "
                "[RowVersion] bigint IDENTITY(1,1) NOT NULL)",
                [t],
            ),
            (
                "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = %s AND object_id = OBJECT_ID(%s)) "
                f"CREATE NONCLUSTERED INDEX {self.quote(idx['rowversion'])} ON {t} ([RowVersion] ASC)",
                [idx["rowversion"], t],
            ),
            (
                "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = %s AND object_id = OBJECT_ID(%s)) "
                f"CREATE NONCLUSTERED INDEX {self.quote(idx['expires'])} ON {t} ([Expires] ASC) "
                "INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL",
                [idx["expires"], t],
            ),
        ]

    def drop_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        return [(f"IF OBJECT_ID(%s, N'U') IS NOT NULL DROP TABLE {t}", [t])]

    def existing_indexes(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT name FROM sys.indexes WHERE object_id = OBJECT_ID(%s) AND name IS NOT NULL",
                [self.table(name)])

    def table_exists(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT 1 WHERE OBJECT_ID(%s, N'U') IS NOT NULL", [self.table(name)])

    def now_sql(self) -> str:
        return "GETUTCDATE()"

    def expires_after_ttl_sql(self) -> str:
        # DATEADD takes an int (overflow past 2**31 - 1): milliseconds overflow after
        # 24.8 days and seconds after 68 years, while a TTL may be up to 100 years
        # (queues.MAX_TTL_SECONDS).  So: whole minutes, then the milliseconds left
        # over (< 60000).  Params: ttl_params(ttl) = [milliseconds, minutes].
        return "DATEADD(millisecond, %s, DATEADD(minute, %s, GETUTCDATE()))"

    def ttl_params(self, ttl_seconds: float) -> list[Any]:
        minutes, ms = divmod(int(round(ttl_seconds * 1000)), 60_000)
        return [ms, minutes]

    def datetime_param(self, value: dt.datetime | None) -> Any:
        if value is None:
            return None
        # datetime columns hold naive UTC.
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)

    def insert_along(self, insert_sql: str, along_sql: str) -> str | None:
        # One batch; NOCOUNT keeps the insert's row count from coming back before along's row.
        return f"SET NOCOUNT ON; {insert_sql}; {along_sql}"

    def receive(self, name: str) -> str:
        return self._receive(name, "")

    def receive_from(self, name: str) -> str:
        return self._receive(name, "WHERE [RowVersion] >= %s ")

    def receive_from_params(self, mark: int, limit: int) -> list[Any]:
        return [limit, mark]  # TOP comes before WHERE

    def _receive(self, name: str, where: str) -> str:
        t = self.table(name)
        return (
            "SET NOCOUNT ON; "
            f"WITH message AS (SELECT TOP (%s) * FROM {t} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"{where}ORDER BY [RowVersion]) "
            f"DELETE FROM message OUTPUT {self._message_columns('deleted.')}, "
            f"{self.expired_sql('deleted.[Expires]')};"
        )

    def delete_by_id(self, name: str) -> str:
        return f"DELETE FROM {self.table(name)} WITH (ROWLOCK, READPAST) WHERE [Id] = %s"

    def purge_expired(self, name: str) -> str:
        # The receive's shape: ROWLOCK so no page locks (batches stay ≤ 4,000 rows, under
        # the 5,000 at which SQL Server escalates to a table lock), READPAST so rows a
        # receiver holds are passed over, and rows taken in RowVersion order — the
        # receive's order — so a purge and a receive never lock in opposite orders.
        return self._delete_top(name, "WHERE [Expires] IS NOT NULL AND [Expires] <= GETUTCDATE() ")

    def _delete_top(self, name: str, where: str) -> str:
        return (
            f"WITH message AS (SELECT TOP (%s) * FROM {self.table(name)} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"{where}ORDER BY [RowVersion]) DELETE FROM message"
        )

    def receive_expired(self, name: str) -> str:
        t = self.table(name)
        return (
            "SET NOCOUNT ON; "
            f"WITH message AS (SELECT TOP (%s) * FROM {t} WITH (UPDLOCK, READPAST, ROWLOCK) "
            "WHERE [Expires] IS NOT NULL AND [Expires] <= GETUTCDATE() ORDER BY [RowVersion]) "
            f"DELETE FROM message OUTPUT {self._message_columns('deleted.')}, "
            f"{self.expired_sql('deleted.[Expires]')};"
        )

    def lock_table(self, name: str) -> str:
        # TOP (1), not TOP 0: for TOP 0 the optimizer may answer from a constant scan
        # without opening the table, and then takes no lock at all.  Reading (at most)
        # one row makes it open the table under TABLOCKX; HOLDLOCK keeps the exclusive
        # table lock to the end of the transaction, so a concurrent send waits for it.
        return f"SELECT TOP (1) 1 FROM {self.table(name)} WITH (TABLOCKX, HOLDLOCK)"

    def purge_all(self, name: str) -> str:
        return self._delete_top(name, "")  # see purge_expired

    # -- delayed-message store (the layout of the transport's SQL Server store) ---------
    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        return self.create_schema() + [
            ("IF OBJECT_ID(%s, N'U') IS NULL "
             f"CREATE TABLE {t} ([Id] nvarchar(250) NOT NULL PRIMARY KEY, [Destination] nvarchar(200) NOT NULL, "
             "[State] varbinary(max) NULL, [Time] datetime NOT NULL, [Headers] nvarchar(max) NOT NULL, "
             "[RetryCount] int NOT NULL DEFAULT 0)", [t]),
            ("IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = %s AND object_id = OBJECT_ID(%s)) "
             f"CREATE NONCLUSTERED INDEX {self.quote(self.delayed_time_index(name))} ON {t} ([Time] ASC)",
             [self.delayed_time_index(name), t]),
        ]

    def rename_delayed_table(self, old: str, new: str) -> list[tuple[str, list[Any]]]:
        # sp_rename takes the qualified old name and the bare new one; the index is
        # named Index_Time on every store table, so it needs no renaming.
        return [("EXEC sp_rename %s, %s", [self.table(old), new])]

    def delayed_insert_at(self, name: str) -> str:
        # Params: id, destination, state, time, headers — then id again for the existence check.
        t = self.table(name)
        return (
            "SET NOCOUNT ON; "
            f"INSERT INTO {t} ({self._delayed_columns()}) OUTPUT inserted.[Time] "
            "SELECT %s, %s, %s, %s, %s, 0 "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE [Id] = %s)"
        )

    def delayed_insert_after(self, name: str) -> str:
        t = self.table(name)
        return (
            "SET NOCOUNT ON; "
            f"INSERT INTO {t} ({self._delayed_columns()}) OUTPUT inserted.[Time] "
            f"SELECT %s, %s, %s, {self.expires_after_ttl_sql()}, %s, 0 "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} WITH (UPDLOCK, HOLDLOCK) WHERE [Id] = %s)"
        )

    def delayed_insert_many(self, name: str, count: int, after: bool) -> str:
        # No ON CONFLICT: a VALUES list, each row inserted only when its Id is not stored.
        t = self.table(name)
        when = self.expires_after_ttl_sql() if after else "%s"
        rows = ", ".join([f"(%s, %s, %s, {when}, %s)"] * count)
        return (
            "SET NOCOUNT ON; "
            f"INSERT INTO {t} ({self._delayed_columns()}) OUTPUT inserted.[Time] "
            "SELECT v.[Id], v.[Destination], v.[State], v.[Time], v.[Headers], 0 "
            f"FROM (VALUES {rows}) AS v([Id], [Destination], [State], [Time], [Headers]) "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} AS s WITH (UPDLOCK, HOLDLOCK) WHERE s.[Id] = v.[Id])"
        )

    def delayed_insert_params(self, id_: str, destination: str, state: bytes, time_params: list[Any],
                              headers: str) -> list[Any]:
        # The id again at the end, for the NOT EXISTS check.
        return [id_, destination, state, *time_params, headers, id_]

    def delayed_claim_due(self, name: str) -> str:
        # The receive's shape (a CTE with TOP, UPDLOCK + READPAST + ROWLOCK, DELETE …
        # OUTPUT): rows another mover holds are passed over, not waited for.
        cols = ", ".join(f"deleted.{self.quote(c)}" for c in DELAYED_COLUMNS)
        return (
            "SET NOCOUNT ON; "
            f"WITH message AS (SELECT TOP (%s) * FROM {self.table(name)} WITH (UPDLOCK, READPAST, ROWLOCK) "
            f"WHERE [Time] <= COALESCE(%s, {self.now_sql()}) ORDER BY [Time]) "
            f"DELETE FROM message OUTPUT {cols};"
        )

    def delayed_claim_params(self, at: Any, limit: int) -> list[Any]:
        return [limit, at]  # TOP (%s) comes first

    # -- dashboard statistics (TOP instead of LIMIT; NOLOCK: estimates never wait) -----------
    def _capped_count(self, source: str, where: str) -> str:
        return f"(SELECT COUNT(*) FROM (SELECT TOP (%s) 1 AS x FROM {source}{where}) c)"


    def _queue_rows(self, names: list[str], expired: bool, cap: int | None = None) -> str:
        top = "%s" if cap is None else str(int(cap))
        parts = []
        for position, name in enumerate(names):
            t = self.table(name)
            expired_count = (f"(SELECT COUNT(*) FROM (SELECT TOP (%s) 1 AS x FROM {t} WITH (NOLOCK) "
                             f"WHERE [Expires] IS NOT NULL AND [Expires] <= GETUTCDATE()) e), ") if expired else ""
            parts.append(
                f"SELECT {'%s' if cap is None else position}, (SELECT MIN([RowVersion]) FROM {t} WITH (NOLOCK)), "
                f"(SELECT MAX([RowVersion]) FROM {t} WITH (NOLOCK)), "
                f"(SELECT COUNT(*) FROM (SELECT TOP ({top}) 1 AS x FROM {t} WITH (NOLOCK)) c), {expired_count}"
                f"(SELECT TOP 1 [Headers] FROM {t} WITH (NOLOCK) ORDER BY [RowVersion]), GETUTCDATE()")
        return " UNION ALL ".join(parts)

    def delayed_stats(self, name: str) -> str:
        return ("SELECT [Destination], SUM(CASE WHEN [Time] <= GETUTCDATE() THEN 1 ELSE 0 END), COUNT(*) "
                f"FROM (SELECT TOP (%s) [Destination], [Time] FROM {self.table(name)} WITH (NOLOCK) "
                "ORDER BY [Time]) d GROUP BY [Destination]")
