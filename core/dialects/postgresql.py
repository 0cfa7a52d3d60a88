"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` receives, partial index on Expires,
an advisory lock around DDL so concurrent start-ups do not race on the catalog."""
from __future__ import annotations

from typing import Any, Sequence

from core.dialects.base import Dialect
from core.dialects.rows import COLUMNS
from core.dialects.limits_sql import LimitsSQL
from core.dialects.delayed_sql import DelayedSQL
from core.dialects.dashboard_sql import DashboardSQL
from core.dialects.failed_counts_sql import PostgreSQLFailedCountsSQL
from core.dialects.outbox_sql import OutboxSQL
from core.dialects.tasks_sql import PostgreSQLTaskSQL

# pg_advisory_xact_lock key for Sluice's DDL ("sluice" as an int).
DDL_LOCK_KEY = 0x736C7569

#: psycopg's prepare_threshold that never prepares a statement on its own (see server_cursor).
PREPARE_NOTHING_AUTOMATICALLY = 2**62

#: Autovacuum settings of every queue table and the delayed store.  A queue table's rows
#: are all deleted soon after they are inserted: by the default thresholds (20 % of the
#: table dead) autovacuum waits while the dead rows pile up at the front of the RowVersion
#: index, which every receive scans from the start.  Here it runs as soon as 1,000 rows
#: are dead, without the cost-based pauses, and statistics follow the table's swings.
#: The tables stay logged: a receive's delete is as durable as the send's insert.
TABLE_UPKEEP = (
    ("autovacuum_vacuum_scale_factor", "0"),
    ("autovacuum_vacuum_threshold", "1000"),
    ("autovacuum_vacuum_cost_delay", "0"),
    ("autovacuum_analyze_scale_factor", "0"),
    ("autovacuum_analyze_threshold", "5000"),
    # A drained table keeps its pages: a plan made while it is empty still prices a
    # sequential scan at the table's size, so it uses the indexes (and the truncation's
    # ACCESS EXCLUSIVE lock never holds up sends and receives).
    ("vacuum_truncate", "false"),
)


#: A COPY's columns: an INSERT's parameters without a TTL (Recoverable takes its default).
_COPIED_COLUMNS = tuple(c for c in COLUMNS[:-1] if c != "Recoverable")
#: libpq's PQTRANS_INERROR (psycopg.pq.TransactionStatus.INERROR): in a failed transaction.
_PQTRANS_INERROR = 3


class PostgreSQLDialect(PostgreSQLTaskSQL, DelayedSQL, OutboxSQL, DashboardSQL, PostgreSQLFailedCountsSQL, LimitsSQL, Dialect):
    one_second_ago = "statement_timestamp() - INTERVAL '1 second'"
    json_cast = "CAST({} AS jsonb)"  # a JSON text parameter into a jsonb column
    json_text = "CAST({} AS text)"  # a jsonb column read as its text (the driver parses none)
    vendor = "postgresql"
    true_literal = "TRUE"
    false_literal = "FALSE"
    supports_notify = True
    supports_server_binding = True
    supports_prepared_statements = True
    supports_table_upkeep = True
    supports_copy_in = True
    supports_commit_snapshots = True
    supports_receive_mark = True
    supports_claim_with_next = True
    limit = " LIMIT %s"
    readpast_hint = nolock_hint = lock_skip_hint = ""  # MVCC: readers never wait for writers
    skip_locked_suffix = " FOR UPDATE SKIP LOCKED"
    # The subquery runs once (an InitPlan) and the outer scan takes its rows by the key:
    # no join, so no plan can run the locking subquery again for every row of the table.
    # A queue table is often analyzed empty; a prepared receive keeps the generic plan
    # made then until the next ANALYZE, and with "IN (SELECT …)" that plan walked the
    # whole table per receive once a burst filled it (tests/test_receive_plans.py).
    locked_rows = "{key} = ANY(ARRAY({rows}))"
    max_parameters = 60_000
    # serialization_failure, deadlock_detected, lock_not_available (lock_timeout),
    # query_canceled (statement_timeout), connection exceptions, admin/crash shutdown.
    transient_errors = frozenset({"40001", "40P01", "55P03", "57014", "08000", "08003", "08006",
                                  "57P01", "57P02", "57P03"})
    missing_table_errors = frozenset({"42P01"})  # undefined_table

    def server_cursor(self, raw_connection: Any, prepare: bool) -> Any:
        # psycopg 3's plain Cursor binds on the server ($1 …), sending bytes and arrays as
        # parameters instead of quoted literals; Django's default is a ClientCursor.
        import psycopg

        if prepare and raw_connection.prepare_threshold is None:
            # Django sets psycopg's threshold to None (no automatic preparation), which
            # also refuses execute(prepare=True).  A threshold no statement reaches keeps
            # automatic preparation off and lets the chosen statements be prepared.
            # (Django's ClientCursor never prepares, whatever the threshold.)
            raw_connection.prepare_threshold = PREPARE_NOTHING_AUTOMATICALLY
        return psycopg.Cursor(raw_connection)

    def transaction_aborted(self, raw_connection: Any) -> bool:
        # libpq's own record of the last result: no statement is sent.  Its number, not
        # ``info.transaction_status``, which makes an enum member per call (this runs
        # after every handler call).
        return raw_connection is not None and raw_connection.pgconn.transaction_status == _PQTRANS_INERROR

    def error_codes(self, exc: BaseException) -> set[str]:
        code = getattr(exc, "sqlstate", None)  # psycopg errors
        return {code} if code else set()

    def ddl_lock(self) -> tuple[str, list[Any]]:
        return ("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK_KEY])

    def create_schema(self) -> list[tuple[str, list[Any]]]:
        if not self.schema:
            return []
        return [(f"CREATE SCHEMA IF NOT EXISTS {self.quote(self.schema)}", [])]

    def create_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.index_names(name)
        return self.create_schema() + [
            (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                '"Id" uuid NOT NULL, '
                '"CorrelationId" varchar(255) NULL, '
                '"ReplyToAddress" varchar(255) NULL, '
                '"Recoverable" boolean NOT NULL DEFAULT TRUE, '
                '"Expires" timestamptz NULL, '
                '"Headers" text NOT NULL, '
                '"Body" bytea NULL, '
                '"RowVersion" bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL)',
                [],
            ),
            (f'CREATE UNIQUE INDEX IF NOT EXISTS {self.quote(idx["rowversion"])} ON {t} ("RowVersion")', []),
            (
                f'CREATE INDEX IF NOT EXISTS {self.quote(idx["expires"])} ON {t} ("Expires") '
                'WHERE "Expires" IS NOT NULL',
                [],
            ),
            *self.table_upkeep(name),
        ]

    def table_upkeep(self, name: str) -> list[tuple[str, list[Any]]]:
        # SHARE UPDATE EXCLUSIVE: sends and receives go on while it runs.
        settings = ", ".join(f"{key} = {value}" for key, value in TABLE_UPKEEP)
        return [(f"ALTER TABLE IF EXISTS {self.table(name)} SET ({settings})", [])]

    def table_upkeep_active(self) -> tuple[str, list[Any]]:
        # Per-table settings cannot turn autovacuum on when the server has it off.
        return ("SELECT current_setting('autovacuum') = 'on'", [])

    def reclaim_dead_rows(self, name: str) -> tuple[str, list[Any]]:
        return (f"VACUUM (ANALYZE) {self.table(name)}", [])

    def drop_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        return [(f"DROP TABLE IF EXISTS {self.table(name)}", [])]

    def existing_indexes(self, name: str) -> tuple[str, list[Any]]:
        return (
            "SELECT indexname FROM pg_indexes WHERE tablename = %s "
            "AND schemaname = COALESCE(%s, current_schema())",
            [name, self.schema],
        )

    def table_exists(self, name: str) -> tuple[str, list[Any]]:
        return (
            "SELECT 1 FROM pg_tables WHERE tablename = %s AND schemaname = COALESCE(%s, current_schema())",
            [name, self.schema],
        )

    def now_sql(self) -> str:
        # statement_timestamp(), not now(): now() is frozen at the start of the transaction,
        # and a receive transaction can be long; clock_timestamp() is volatile and would
        # keep the planner off the Expires index.
        return "statement_timestamp()"

    def delayed_claim_due_and_next(self, name: str) -> str:
        # The outer query reads the snapshot from before the claim's DELETE, so the rows
        # it took are left out by their ids.  statement_timestamp() is one value for the
        # whole statement: the claim's "due by now" and the now returned are the same.
        t, time, id_ = self.table(name), self.quote("Time"), self.quote("Id")
        return (
            f"WITH claimed AS ({self.delayed_claim_due(name)}) "
            f"SELECT c.*, n.next_due, n.now FROM (SELECT "
            f"{self.edge(time, t, where=f' WHERE {id_} NOT IN (SELECT {id_} FROM claimed)')} AS next_due, "
            f"{self.now_sql()} AS now) AS n "
            "LEFT JOIN claimed AS c ON TRUE"
        )

    def expires_after_ttl_sql(self) -> str:
        return "statement_timestamp() + make_interval(secs => %s)"

    def insert_rows_per_statement(self, params_per_row: int) -> int:
        return 10_000  # six array parameters, whatever the number of rows

    #: Fewer rows than this go in with INSERT: a COPY takes two round trips to INSERT's one.
    copy_rows_from = 128

    def copy_rows(self, name: str, count: int, with_ttl: bool) -> str | None:
        # The server parses COPY's rows with less work per row than it unnests arrays into
        # an INSERT, and the driver writes them without building an array per column.
        if with_ttl or count < self.copy_rows_from:
            return None
        return self.copy_in(self.table(name), _COPIED_COLUMNS)

    def record_horizon(self, table: str) -> str:
        # pg_current_snapshot() is this statement's snapshot, the one MAX(id) reads.  An id
        # below that maximum but invisible to it belongs to a transaction still open then
        # (or one that rolled back), and the token lists those transactions:
        # - the snapshot's xip list, less the entries pg_stat_activity shows as ANOTHER
        #   database's (the snapshot is cluster-wide; backend_xid is the xid8's low 32 bits
        #   and is readable by every role): an export no longer waits for other databases;
        # - this database's open transactions at or past the snapshot's xmax, which the xip
        #   list leaves out: a receive that took its xid after an earlier-started receive
        #   committed can still hold a lower record id (its xid is made an xid8 near xmax).
        # The token is pg_snapshot text with xmax raised past its last entry, so
        # horizon_settled reads it as before (and reads tokens stored by older versions).
        return f"""
WITH snap AS (SELECT pg_current_snapshot() AS s),
here AS (SELECT oid FROM pg_database WHERE datname = current_database()),
elsewhere AS (
    SELECT a.backend_xid::text::bigint AS x32 FROM pg_stat_activity AS a
    WHERE a.backend_xid IS NOT NULL AND a.datid IS DISTINCT FROM (SELECT oid FROM here)),
late AS (
    SELECT r.v + CASE WHEN r.v > sm.m + 2147483648 THEN -4294967296
                      WHEN r.v < sm.m - 2147483648 THEN 4294967296 ELSE 0 END AS x, sm.m
    FROM (SELECT pg_snapshot_xmax(s)::text::bigint AS m FROM snap) AS sm,
    LATERAL (SELECT sm.m - sm.m % 4294967296 + a.backend_xid::text::bigint AS v FROM pg_stat_activity AS a
             WHERE a.backend_xid IS NOT NULL AND a.datid = (SELECT oid FROM here)) AS r),
held AS (
    SELECT x::text::bigint AS x FROM snap, pg_snapshot_xip(snap.s) AS x
    WHERE x::text::bigint % 4294967296 NOT IN (SELECT x32 FROM elsewhere)
    UNION
    SELECT x FROM late WHERE x >= m)
SELECT (SELECT MAX({self.quote('id')}) FROM {table}),
       (SELECT pg_snapshot_xmin(s)::text || ':'
               || GREATEST(pg_snapshot_xmax(s)::text::bigint, COALESCE((SELECT MAX(x) + 1 FROM held), 0))::text
               || ':' || COALESCE((SELECT string_agg(x::text, ',' ORDER BY x) FROM held), '')
        FROM snap)"""

    def horizon_settled(self) -> str:
        return ("SELECT NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(%s::pg_snapshot) AS x "
                "WHERE NOT pg_visible_in_snapshot(x, pg_current_snapshot()))")

    def copy_in(self, table: str, columns: Sequence[str]) -> str:
        return f"COPY {table} ({', '.join(self.quote(c) for c in columns)}) FROM STDIN"

    def insert_along(self, insert_sql: str, along_sql: str) -> str | None:
        # A data-modifying WITH runs exactly once whether or not the main statement reads it.
        return f"WITH sluice_inserted AS ({insert_sql}) {along_sql}"

    def insert_rows(self, name: str, rows: Sequence[Sequence[Any]], with_ttl: bool) -> tuple[str, list[Any]]:
        """One ``INSERT … SELECT … FROM unnest(<one array per column>) WITH ORDINALITY``,
        inserted in ORDER BY ordinality so RowVersions follow the list."""
        if len(rows) == 1:
            return super().insert_rows(name, rows, with_ttl)
        expires, kind = ("statement_timestamp() + make_interval(secs => u.e)", "float8") if with_ttl \
            else ("u.e", "timestamptz")
        sql = (f"INSERT INTO {self.table(name)} ({self._insert_columns()}) "
               f"SELECT u.i, u.c, u.r, TRUE, {expires}, u.h, u.b "
               f"FROM unnest(%b::uuid[], %b::varchar[], %b::varchar[], %b::{kind}[], %b::text[], %b::bytea[]) "
               "WITH ORDINALITY AS u(i, c, r, e, h, b, n) ORDER BY u.n")
        return sql, [list(column) for column in zip(*rows)]

    def expired_sql(self, column: str | None = None) -> str:
        column = column or self._col("Expires")
        return f"({column} IS NOT NULL AND {column} <= statement_timestamp())"

    def edge(self, column: str, source: str, last: bool = False, where: str = "") -> str:
        # One index entry, not MIN()/MAX(): told the table holds one row (analyzed while
        # empty), the planner aggregates the whole index instead (tests/test_receive_plans.py).
        return f"(SELECT {column} FROM {source}{where} ORDER BY {column}{' DESC' if last else ''} LIMIT 1)"

    def receive(self, name: str) -> str:
        return self._receive(name, "")

    def receive_from(self, name: str) -> str:
        return self._receive(name, 'WHERE "RowVersion" >= %s ')

    def _receive(self, name: str, where: str) -> str:
        t = self.table(name)
        rows = f'SELECT "RowVersion" FROM {t} {where}ORDER BY "RowVersion" LIMIT %s FOR UPDATE SKIP LOCKED'
        return self.delete_locked(t, self.quote("RowVersion"), rows, f"{self._message_columns()}, {self.expired_sql()}")

    def delete_by_id(self, name: str) -> str:
        t = self.table(name)
        rows = f'SELECT "RowVersion" FROM {t} WHERE "Id" = %s FOR UPDATE SKIP LOCKED'
        return self.delete_locked(t, self.quote("RowVersion"), rows)

    def purge_expired(self, name: str) -> str:
        t = self.table(name)
        # Skip rows a receiver holds: the purge never waits on (or deadlocks with) a receive.
        rows = (f'SELECT "RowVersion" FROM {t} '
                'WHERE "Expires" IS NOT NULL AND "Expires" <= statement_timestamp() '
                # ORDER BY keeps the planner on the partial Expires index even when most rows
                # are expired; a seq scan would re-read the purged front of the table each batch.
                'ORDER BY "Expires" LIMIT %s FOR UPDATE SKIP LOCKED')
        return self.delete_locked(t, self.quote("RowVersion"), rows)

    def lock_table(self, name: str) -> str:
        return f"LOCK TABLE {self.table(name)} IN ACCESS EXCLUSIVE MODE"

    def purge_all(self, name: str) -> str:
        t = self.table(name)
        rows = f'SELECT "RowVersion" FROM {t} LIMIT %s FOR UPDATE SKIP LOCKED'
        return self.delete_locked(t, self.quote("RowVersion"), rows)

    # -- delayed-message store -------------------------------------------------
    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        return self.create_schema() + [
            (f"CREATE TABLE IF NOT EXISTS {t} ("
             '"Id" varchar(250) NOT NULL PRIMARY KEY, "Destination" varchar(200) NOT NULL, "State" bytea NULL, '
             '"Time" timestamptz NOT NULL, "Headers" text NOT NULL, "RetryCount" integer NOT NULL DEFAULT 0)', []),
            (f'CREATE INDEX IF NOT EXISTS {self.quote(self.delayed_time_index(name))} ON {t} ("Time")', []),
            *self.table_upkeep(name),
        ]


    def notify(self) -> str:
        return "SELECT pg_notify(%s, %s)"

    # -- outbox -------------------------------------------------------------------
    def create_outbox_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.outbox_index_names(name)
        return self.create_schema() + [
            (
                f"CREATE TABLE IF NOT EXISTS {t} ("
                '"MessageId" varchar(200) NOT NULL PRIMARY KEY, '
                '"Dispatched" boolean NOT NULL DEFAULT FALSE, '
                '"DispatchedAt" timestamptz NULL, '
                '"PersistenceVersion" varchar(23) NOT NULL, '
                '"Operations" text NOT NULL, '
                '"CreatedAt" timestamptz NOT NULL DEFAULT statement_timestamp(), '
                '"Quarantined" boolean NOT NULL DEFAULT FALSE, '
                '"LastError" text NULL)',
                [],
            ),
            # Partial indexes: the clean-up reads only dispatched rows by age, the
            # dispatcher only the (few) undispatched ones.
            (f'CREATE INDEX IF NOT EXISTS {self.quote(idx["dispatched_at"])} ON {t} ("DispatchedAt") '
             'WHERE "Dispatched" = TRUE', []),
            (f'CREATE INDEX IF NOT EXISTS {self.quote(idx["undispatched"])} ON {t} ("CreatedAt") '
             'WHERE "Dispatched" = FALSE', []),
        ]

    def before_now_sql(self) -> str:
        return "statement_timestamp() - make_interval(secs => %s)"

    def outbox_cleanup(self, name: str) -> str:
        t = self.table(name)
        rows = (f'SELECT "MessageId" FROM {t} WHERE "Dispatched" = TRUE '
                f'AND "DispatchedAt" <= {self.before_now_sql()} LIMIT %s FOR UPDATE SKIP LOCKED')
        return self.delete_locked(t, self.quote("MessageId"), rows)

    def outbox_size(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT COALESCE(pg_total_relation_size(to_regclass(%s)), 0)", [self.table(name)])

    # -- outbox phase-2 lease (core-b; see Dialect.outbox_claim_lease) -------------------
    OUTBOX_LEASE_COLUMN_TYPES = {"DispatchingUntil": "timestamptz", "DispatchToken": "varchar(36)"}

    def outbox_column_exists(self, name: str, column: str) -> tuple[str, list[Any]]:
        return ("SELECT 1 FROM information_schema.columns WHERE table_name = %s "
                "AND column_name = %s AND table_schema = COALESCE(%s, current_schema())",
                [name, column, self.schema])

    def outbox_add_column(self, name: str, column: str) -> str:
        return (f"ALTER TABLE {self.table(name)} ADD COLUMN IF NOT EXISTS {self.quote(column)} "
                f"{self.OUTBOX_LEASE_COLUMN_TYPES[column]} NULL")

    def outbox_claim_lease(self, name: str, count: int, include_quarantined: bool = False) -> str:
        # SKIP LOCKED: a record another transaction is claiming right now is not waited for.
        t = self.table(name)
        return (f'UPDATE {t} SET "DispatchingUntil" = {self.expires_after_ttl_sql()}, "DispatchToken" = %s '
                "WHERE " + self.locked_rows.format(key=self.quote("MessageId"), rows=(
                    f'SELECT "MessageId" FROM {t} WHERE {self._claim_where(count, include_quarantined)} '
                    f"AND {self._lease_free()} FOR UPDATE SKIP LOCKED")) +
                f' RETURNING "MessageId", "Operations", "CreatedAt", {self.now_sql()}')

    # -- dashboard: free-text search over failed messages through a trigram index -------------
    statement_timeout_errors = frozenset({"57014"})  # query_canceled

    def statement_timeout(self, seconds: float) -> tuple[str, list[Any]]:
        # SET takes no bound parameter; set_config(..., false) is the same, for the session.
        return ("SELECT set_config('statement_timeout', %s, false)", [str(max(int(seconds * 1000), 1))])

    def statement_timeout_reset(self) -> tuple[str, list[Any]]:
        return ("RESET statement_timeout", [])

    def failed_search_expression(self) -> str:
        return ('UPPER("message_id" || \' \' || "exception_type" || \' \' || "exception_message" || \' \' '
                '|| "message_type" || \' \' || "original_queue")')

    def failed_search_indexes(self) -> list[tuple[str, list[Any]]]:
        # pg_trgm is a trusted extension (PostgreSQL 13+): the database owner may create it.
        return [("CREATE EXTENSION IF NOT EXISTS pg_trgm", []),
                ("CREATE INDEX IF NOT EXISTS sluice_fm_search ON sluice_failed_message "
                 f"USING gin (({self.failed_search_expression()}) gin_trgm_ops)", [])]
