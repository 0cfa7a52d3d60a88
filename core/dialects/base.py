"""The dialect interface: capability flags, SQL fragments and named SQL for queue tables.

Column order of every statement that returns messages is :data:`MESSAGE_COLUMNS`
followed by an ``expired`` flag computed by the database's own clock.

Statements that differ between databases only in how they limit rows and take locks
are written once here from :data:`FRAGMENTS`, which every dialect must define (one
missing fails at construction); statements whose shape differs (a DELETE that returns
rows, DDL) are abstract and each dialect writes its own.
"""
from __future__ import annotations

import abc
import datetime as dt
import hashlib
from typing import Any, Sequence

from core.dialects.removal_sql import RemovalSQL
from core.dialects.rows import COLUMNS, MESSAGE_COLUMNS, Row, row_id

#: Where the microseconds of an ``instant`` column count from (:meth:`Dialect.to_datetime`).
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

#: SQL fragments every dialect defines (a class attribute each, "" where it needs none):
#: - ``limit``: ends an ordered SELECT, taking the row limit as its last parameter
#:   (`` LIMIT %s``; SQL Server `` OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY``);
#: - ``readpast_hint``: after a table name, read past rows others hold (SQL Server READPAST);
#: - ``nolock_hint``: after a table name, read without locks (an estimate or a listing);
#: - ``lock_skip_hint``: after a table name, lock the rows read and skip rows others hold;
#: - ``skip_locked_suffix``: the same at the end of the statement (PostgreSQL's
#:   ``FOR UPDATE SKIP LOCKED``; "" where one writer at a time needs no row locks).
FRAGMENTS = ("limit", "readpast_hint", "nolock_hint", "lock_skip_hint", "skip_locked_suffix")


class Dialect(RemovalSQL, abc.ABC):
    """Base class: flags, fragments, shared helpers and the statements written once; each
    dialect fills in the rest (and mixes in DelayedSQL and OutboxSQL)."""

    vendor: str = ""
    #: Several connections can write at once (False: one writer at a time, SQLite).
    supports_concurrent_writers: bool = True
    #: Queue tables may live in a named schema.
    supports_schemas: bool = True
    #: RowVersion is the table's integer primary key, so it needs no index of its own.
    rowversion_is_primary_key: bool = False
    #: The database can wake listeners in other processes when a transaction commits
    #: (PostgreSQL LISTEN/NOTIFY); otherwise movers poll every ``wake_poll_interval`` s.
    supports_notify: bool = False
    wake_poll_interval: float = 0.5
    #: Statements can run through a driver cursor that binds parameters on the server, on
    #: the connection Django holds (:meth:`server_cursor`; core.db.StatementCursor).
    supports_server_binding: bool = False
    #: That cursor can make a statement a server-side prepared one (``prepare=True``).
    supports_prepared_statements: bool = False
    #: Queue tables take per-table storage settings (:meth:`table_upkeep`): PostgreSQL's
    #: autovacuum thresholds for a table whose rows are all deleted soon after insertion.
    supports_table_upkeep: bool = False
    #: Many rows go into a table as one ``COPY … FROM STDIN`` (:meth:`copy_in`) through the
    #: server cursor (core.db.StatementCursor.copy_in): the database parses no parameters
    #: and the driver builds no arrays (PostgreSQL: a processing record costs about a
    #: quarter less database CPU than through ``INSERT … unnest``).
    supports_copy_in: bool = False
    #: The database can tell whether every transaction open when a statement ran has ended
    #: (:meth:`record_horizon` returns a token, :meth:`horizon_settled` checks it): the
    #: records export waits exactly as long as it must (PostgreSQL's snapshots).  Without
    #: it, a horizon settles after SLUICE_RECORDS_EXPORT_DELAY (or at once with one
    #: writer at a time, see :attr:`supports_concurrent_writers`).
    supports_commit_snapshots: bool = False
    #: A receive's scan pays for the rows earlier receives deleted until the database
    #: drops them (MVCC, ghost records), which a held horizon puts off: receives start
    #: at a mark kept in the process (:meth:`receive_from`, core.runtime.marks).
    supports_receive_mark: bool = False
    #: The delayed mover's claim can also say, in the same statement, when the next
    #: message left in the store is due and the database's now
    #: (:meth:`delayed_claim_due_and_next`): the mover's step saves the round trip that
    #: asked it after the commit.
    supports_claim_with_next: bool = False
    # The fragments (see FRAGMENTS): None here, so a dialect that forgets one fails.
    limit: str | None = None
    readpast_hint: str | None = None
    nolock_hint: str | None = None
    lock_skip_hint: str | None = None
    skip_locked_suffix: str | None = None
    #: The rows a statement's subquery locked, as its WHERE names them: ``{key}`` and
    #: ``{rows}`` (that SELECT).  PostgreSQL runs it once, never as a join (postgresql.py).
    locked_rows: str = "{key} IN ({rows})"
    #: The most parameters one statement may carry (SQL Server allows 2,100; SQLite
    #: 32,766; PostgreSQL 65,535): statements with one parameter per row are cut to fit.
    max_parameters: int = 30_000
    #: :meth:`counts` reads committed data (False: it reads without locks, SQL Server's
    #: NOLOCK, so it may count rows of uncommitted sends and receives).
    counts_are_exact: bool = True
    #: The SQL function giving a binary column's size in bytes: listings select it instead
    #: of the column, so a page of 4 MiB bodies costs a page of integers.
    byte_length_function: str = "OCTET_LENGTH"
    #: Error codes (:meth:`error_codes`) of failures that are the database's passing state
    #: — deadlock, lock timeout, serialization failure, lost connection — rather than the
    #: statement's: the work is retried later and no message is blamed for it.
    transient_errors: frozenset[str] = frozenset()
    #: Error codes of "the table does not exist" (a queue dropped meanwhile).
    missing_table_errors: frozenset[str] = frozenset()

    def __init__(self, schema: str | None = None) -> None:
        missing = [f for f in FRAGMENTS if getattr(self, f) is None]
        if missing:
            raise TypeError(f"{type(self).__name__} does not define the SQL fragment(s) {', '.join(missing)}")
        if schema is not None and not self.supports_schemas:
            raise ValueError(f"{self.vendor} has no schemas: SLUICE_SCHEMA must be empty")
        self.schema = schema

    # -- identifiers ---------------------------------------------------------
    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def table(self, name: str) -> str:
        """The quoted, schema-qualified table name of a queue."""
        if self.schema:
            return f"{self.quote(self.schema)}.{self.quote(name)}"
        return self.quote(name)

    def index_names(self, name: str) -> dict[str, str]:
        """Index names for a queue table: {'rowversion': …, 'expires': …}.

        PostgreSQL and SQLite index names are unique per schema and PostgreSQL cuts
        identifiers at 63 bytes, so they carry a hash of the table name.
        """
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        return {"rowversion": f"sluice_rv_{digest}", "expires": f"sluice_exp_{digest}"}

    def delayed_time_index(self, name: str) -> str:
        """Name of the delayed store's index on Time."""
        return f"sluice_time_{hashlib.sha1(name.encode()).hexdigest()[:12]}"

    # -- value conversions ----------------------------------------------------
    def to_row(self, raw: tuple[Any, ...]) -> Row:
        id_, corr, reply, expires, headers, body, row_version, expired = raw
        return Row(
            row_id(id_),
            corr,
            reply,
            None if expires is None else self.to_datetime(expires),
            headers if type(headers) is str else bytes(headers).decode("utf-8", "replace"),
            body if type(body) is bytes else (bytes(body) if body is not None else b""),
            row_version if type(row_version) is int else int(row_version),
            expired if type(expired) is bool else bool(expired),
        )

    def to_datetime(self, value: Any) -> dt.datetime | None:
        """A UTC-aware datetime from what the driver returned for a timestamp column."""
        if value is None:
            return None
        if isinstance(value, int):  # microseconds since the epoch (an ``instant`` column)
            return EPOCH + dt.timedelta(microseconds=value)
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is dt.timezone.utc:
            return value
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)

    def datetime_param(self, value: dt.datetime | None) -> Any:
        """A UTC datetime as the driver wants it for a timestamp column."""
        if value is None:
            return None
        return value.astimezone(dt.timezone.utc)

    def ttl_params(self, ttl_seconds: float) -> list[Any]:
        """Parameters of :meth:`expires_after_ttl_sql` for a TTL in seconds."""
        return [ttl_seconds]

    def server_cursor(self, raw_connection: Any, prepare: bool) -> Any:
        """A driver cursor binding parameters on the server, on ``raw_connection`` (the
        driver connection Django holds), whose ``execute(..., prepare=True)`` prepares
        when ``prepare``; only where :attr:`supports_server_binding`."""
        raise NotImplementedError(f"{self.vendor} statements bind through Django's cursor")

    # -- errors -----------------------------------------------------------------
    @abc.abstractmethod
    def error_codes(self, exc: BaseException) -> set[str]:
        """The driver's codes for one exception (SQLSTATE, vendor error number)."""

    def transaction_aborted(self, raw_connection: Any) -> bool:
        """Whether a statement error left the open transaction refusing every statement
        until a rollback (PostgreSQL's "current transaction is aborted"), read from the
        driver connection Django holds without a round-trip.  False where a failed
        statement leaves the transaction usable (SQLite; SQL Server unless XACT_ABORT)."""
        return False

    def is_transient(self, exc: BaseException) -> bool:
        """True when ``exc`` (or the driver error Django wrapped in it) is one of
        :attr:`transient_errors`."""
        return self._has_code(exc, self.transient_errors)

    def is_missing_table(self, exc: BaseException) -> bool:
        """True when ``exc`` says a table does not exist (:attr:`missing_table_errors`)."""
        return self._has_code(exc, self.missing_table_errors)

    def _has_code(self, exc: BaseException, codes: frozenset[str]) -> bool:
        seen: BaseException | None = exc
        while seen is not None:
            if self.error_codes(seen) & codes:
                return True
            seen = seen.__cause__
        return False

    # -- named SQL: subclasses provide these -----------------------------------
    def create_schema(self) -> list[tuple[str, list[Any]]]:
        """Statements that create the configured schema if it is missing (none without one);
        every create_*_table starts with them."""
        return []

    @abc.abstractmethod
    def create_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that create the table and its indexes."""

    def ddl_lock(self) -> tuple[str, list[Any]] | None:
        """A statement that serialises DDL across processes for this transaction."""
        return None

    def table_upkeep(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that give a queue (or delayed-store) table the storage
        settings of a table whose rows are deleted soon after they are inserted; none
        unless :attr:`supports_table_upkeep`.  Part of :meth:`create_queue_table`, and
        run over existing tables by ``sluice setup``."""
        return []

    def table_upkeep_active(self) -> tuple[str, list[Any]] | None:
        """A SELECT returning one row whose first column is true when the database will
        act on :meth:`table_upkeep`'s settings (None: nothing to check)."""
        return None

    def reclaim_dead_rows(self, name: str) -> tuple[str, list[Any]] | None:
        """A statement (run outside a transaction) that reclaims the space of a queue
        table's deleted rows now, where the database leaves that to a background process
        which may be off (PostgreSQL's VACUUM); None where deleted rows go at once.  The
        benchmarks run it between phases, so that each drain starts from the same table."""
        return None

    @abc.abstractmethod
    def drop_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that drop the table."""

    @abc.abstractmethod
    def existing_indexes(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning one row per index name on the queue table."""

    @abc.abstractmethod
    def table_exists(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning a row when the queue table exists."""

    @abc.abstractmethod
    def now_sql(self) -> str:
        """SQL expression for the database's current UTC time."""

    @abc.abstractmethod
    def expires_after_ttl_sql(self) -> str:
        """SQL expression: now + a TTL given by :meth:`ttl_params`."""

    def expired_sql(self, column: str | None = None) -> str:
        """SQL expression that is 1/true when the row's expiry (``column``, default the
        Expires column) has passed."""
        column = column or self._col("Expires")
        return f"CASE WHEN {column} IS NOT NULL AND {column} <= {self.now_sql()} THEN 1 ELSE 0 END"

    def _col(self, name: str) -> str:
        return self.quote(name)

    def _insert_columns(self) -> str:
        return ", ".join(self._col(c) for c in COLUMNS[:-1])

    def _message_columns(self, prefix: str = "") -> str:
        return ", ".join(prefix + self._col(c) for c in MESSAGE_COLUMNS)

    def _insert_row(self, with_ttl: bool) -> str:
        expires = self.expires_after_ttl_sql() if with_ttl else "%s"
        return f"(%s, %s, %s, {self.true_literal}, {expires}, %s, %s)"

    def insert_with_ttl(self, name: str) -> str:
        """INSERT one message; Expires = database now + TTL.  Params:
        id, correlation_id, reply_to, *ttl_params, headers, body."""
        return f"INSERT INTO {self.table(name)} ({self._insert_columns()}) VALUES {self._insert_row(True)}"

    def insert_with_expires(self, name: str) -> str:
        """INSERT one message with an explicit Expires (or NULL).  Params:
        id, correlation_id, reply_to, expires, headers, body."""
        return f"INSERT INTO {self.table(name)} ({self._insert_columns()}) VALUES {self._insert_row(False)}"

    def insert_along(self, insert_sql: str, along_sql: str) -> str | None:
        """One statement (one round trip) running a message's INSERT (``insert_sql``, one of
        :meth:`insert_rows`') and then a statement of the caller's that returns one row
        (``along_sql``; its parameters follow the insert's), or None where the database
        has no such form or needs none: then the caller runs ``along_sql`` on its own,
        right after.  SQLite runs in the process, where a second statement costs no trip."""
        return None

    def copy_in(self, table: str, columns: Sequence[str]) -> str:
        """COPY into ``table`` (quoted) of ``columns``, rows from the client in the text
        format.  Only where :attr:`supports_copy_in`."""
        raise NotImplementedError(f"{self.vendor} has no COPY (supports_copy_in)")

    def record_horizon(self, table: str) -> str:
        """One row: the highest id in ``table`` (quoted) and a token for
        :meth:`horizon_settled`, read in one statement (one snapshot)."""
        return f"SELECT MAX({self.quote('id')}), '' FROM {table}"

    def horizon_settled(self) -> str:
        """One row, one boolean: every transaction open when ``record_horizon`` gave the
        token (its one parameter) has ended.  Only where :attr:`supports_commit_snapshots`."""
        raise NotImplementedError(f"{self.vendor} cannot tell which transactions are open "
                                  f"(supports_commit_snapshots)")

    def insert_rows_per_statement(self, params_per_row: int) -> int:
        """How many rows one :meth:`insert_rows` statement takes (within max_parameters)."""
        return max(1, self.max_parameters // params_per_row)

    def insert_rows(self, name: str, rows: Sequence[Sequence[Any]], with_ttl: bool) -> tuple[str, list[Any]]:
        """ONE statement inserting ``rows`` (each the parameters of :meth:`insert_with_ttl`
        or :meth:`insert_with_expires`), RowVersions in list order, Expires from the
        database clock: here a multi-row VALUES (SQLite numbers rows in VALUES order).
        Returns (sql, params); at most :meth:`insert_rows_per_statement` rows."""
        if len(rows) == 1:
            return (self.insert_with_ttl(name) if with_ttl else self.insert_with_expires(name)), list(rows[0])
        values = ", ".join([self._insert_row(with_ttl)] * len(rows))
        return (f"INSERT INTO {self.table(name)} ({self._insert_columns()}) VALUES {values}",
                [p for row in rows for p in row])

    def copy_rows(self, name: str, count: int, with_ttl: bool) -> str | None:
        """A ``COPY … FROM STDIN`` into queue ``name`` for ``count`` rows of
        :meth:`insert_with_expires`' parameters (core.db.StatementCursor.copy_in; Recoverable
        takes its column's default), where it beats :meth:`insert_rows` for that many;
        None: use insert_rows.  Never with a TTL: Expires is then the database's now plus
        the TTL, which a COPY cannot compute."""
        return None

    true_literal = "1"
    false_literal = "0"

    @abc.abstractmethod
    def receive(self, name: str) -> str:
        """Delete and return up to %s oldest messages not locked by other receivers."""

    def receive_from(self, name: str) -> str:
        """:meth:`receive` of the rows from a RowVersion on (params:
        :meth:`receive_from_params`).  Only where :attr:`supports_receive_mark`."""
        raise NotImplementedError(f"{self.vendor} receives from the start (supports_receive_mark)")

    def receive_from_params(self, mark: int, limit: int) -> list[Any]:
        return [mark, limit]

    def peek_estimate(self, name: str) -> str:
        """An estimate of the queue length without counting rows (max − min RowVersion);
        it need not wait for receivers, so it reads without locks where it can."""
        t, rv = f"{self.table(name)}{self.nolock_hint}", self._col("RowVersion")
        return f"SELECT COALESCE({self.edge(rv, t, last=True)} - {self.edge(rv, t)} + 1, 0)"

    def peek_range(self, name: str, from_mark: bool = False) -> str:
        """The least and greatest RowVersion waiting (a pump's look before it receives);
        ``from_mark``: of the rows from RowVersion %s on (the mark, twice), as a receive
        from the mark scans.  ``from_mark`` only where :attr:`supports_receive_mark`."""
        t, rv = f"{self.table(name)}{self.nolock_hint}", self._col("RowVersion")
        where = f" WHERE {rv} >= %s" if from_mark else ""
        return f"SELECT {self.edge(rv, t, where=where)}, {self.edge(rv, t, last=True, where=where)}"

    def edge(self, column: str, source: str, last: bool = False, where: str = "") -> str:
        """A scalar subquery: the least (``last``: greatest) value of an indexed NOT NULL
        ``column`` of ``source`` (a table, hints and all), ``where`` (" WHERE …") applied."""
        return f"(SELECT {'MAX' if last else 'MIN'}({column}) FROM {source}{where})"

    def browse(self, name: str) -> str:
        """Up to %s messages after RowVersion %s, oldest first, without taking them (rows
        receivers hold are passed over).  Params: :meth:`browse_params`."""
        rv = self._col("RowVersion")
        return (
            f"SELECT {self._message_columns()}, {self.expired_sql()} FROM {self.table(name)}{self.readpast_hint} "
            f"WHERE {rv} > %s ORDER BY {rv}{self.limit}"
        )

    def browse_params(self, after_row_version: int, limit: int) -> list[Any]:
        return [after_row_version, limit]

    def counts(self, name: str) -> str:
        """One row: (total, expired).  Exact unless :attr:`counts_are_exact` is False
        (read without locks: uncommitted rows may be counted)."""
        t = f"{self.table(name)}{self.nolock_hint}"
        exp = self._col("Expires")
        return (
            f"SELECT (SELECT COUNT(*) FROM {t}), "
            f"(SELECT COUNT(*) FROM {t} WHERE {exp} IS NOT NULL AND {exp} <= {self.now_sql()})"
        )

    def delete_locked(self, table: str, key: str, rows: str, returning: str = "") -> str:
        """A DELETE of the rows ``rows`` (a SELECT of ``key`` that locks them) selects, named
        as :attr:`locked_rows` says; ``returning``: the RETURNING list, if any."""
        return (f"DELETE FROM {table} WHERE {self.locked_rows.format(key=key, rows=rows)}"
                + (f" RETURNING {returning}" if returning else ""))

    def max_row_version(self, name: str) -> str:
        """One row: the newest RowVersion (NULL when empty)."""
        return f"SELECT MAX({self._col('RowVersion')}) FROM {self.table(name)}"
