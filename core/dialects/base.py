"""The dialect interface: capability flags and named SQL for queue tables.

Column order of every statement that returns messages is :data:`MESSAGE_COLUMNS`
followed by an ``expired`` flag computed by the database's own clock.
"""
from __future__ import annotations

import abc

import datetime as dt
import hashlib
import uuid
from typing import Any, NamedTuple

#: Columns of a queue table, as the SQL transport lays them out.
COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers", "Body", "RowVersion")
#: Columns a receive / browse returns, in this order, then the expired flag.
MESSAGE_COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Expires", "Headers", "Body", "RowVersion")
#: Columns of an outbox table.  The first five are the outbox's own (MessageId, the
#: incoming message or session id, is the primary key); CreatedAt ages stuck records,
#: Quarantined/LastError keep a record that cannot be dispatched visible instead of lost.
OUTBOX_COLUMNS = ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations",
                  "CreatedAt", "Quarantined", "LastError")


#: Columns of the delayed-message store, in the order its SELECTs return them.
DELAYED_COLUMNS = ("Id", "Destination", "State", "Time", "Headers", "RetryCount")


class Row(NamedTuple):
    """A queue row as the database returned it, normalised to Python types."""

    id: str
    correlation_id: str | None
    reply_to: str | None
    expires: dt.datetime | None
    headers: str
    body: bytes
    row_version: int
    expired: bool


class OutboxRow(NamedTuple):
    """An outbox record as the database returned it (:data:`OUTBOX_COLUMNS` order)."""

    message_id: str
    dispatched: bool
    dispatched_at: dt.datetime | None
    persistence_version: str
    operations: str
    created_at: dt.datetime | None
    quarantined: bool
    last_error: str | None


class Dialect(abc.ABC):
    """Base class: shared helpers; subclasses fill in flags and SQL (DelayedSQL is mixed in
    by each dialect)."""

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
    #: Suffix of a SELECT that locks its rows and skips rows others hold ("" when the
    #: database has one writer at a time and needs no row locks).
    skip_locked_suffix: str = ""
    #: The most parameters one statement may carry (SQL Server allows 2,100; SQLite
    #: 32,766; PostgreSQL 65,535): statements with one parameter per row are cut to fit.
    max_parameters: int = 30_000
    #: :meth:`counts` reads committed data (False: it reads without locks, SQL Server's
    #: NOLOCK, so it may count rows of uncommitted sends and receives).
    counts_are_exact: bool = True
    #: Error codes (:meth:`error_codes`) of failures that are the database's passing state
    #: — deadlock, lock timeout, serialization failure, lost connection — rather than the
    #: statement's: the work is retried later and no message is blamed for it.
    transient_errors: frozenset[str] = frozenset()

    def __init__(self, schema: str | None = None) -> None:
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
            id=str(uuid.UUID(str(id_))) if _is_uuid(id_) else str(id_),
            correlation_id=corr,
            reply_to=reply,
            expires=self.to_datetime(expires),
            headers=headers if isinstance(headers, str) else bytes(headers).decode("utf-8", "replace"),
            body=bytes(body) if body is not None else b"",
            row_version=int(row_version),
            expired=bool(expired),
        )

    def to_datetime(self, value: Any) -> dt.datetime | None:
        """A UTC-aware datetime from what the driver returned for a timestamp column."""
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
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

    # -- errors -----------------------------------------------------------------
    @abc.abstractmethod
    def error_codes(self, exc: BaseException) -> set[str]:
        """The driver's codes for one exception (SQLSTATE, vendor error number)."""

    def is_transient(self, exc: BaseException) -> bool:
        """True when ``exc`` (or the driver error Django wrapped in it) is one of
        :attr:`transient_errors`."""
        seen: BaseException | None = exc
        while seen is not None:
            if self.error_codes(seen) & self.transient_errors:
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

    def expired_sql(self, column: str = '"Expires"') -> str:
        """SQL expression that is 1/true when the row's expiry has passed."""
        return f"CASE WHEN {column} IS NOT NULL AND {column} <= {self.now_sql()} THEN 1 ELSE 0 END"

    def _col(self, name: str) -> str:
        return self.quote(name)

    def _insert_columns(self) -> str:
        return ", ".join(self._col(c) for c in COLUMNS[:-1])

    def _message_columns(self, prefix: str = "") -> str:
        return ", ".join(prefix + self._col(c) for c in MESSAGE_COLUMNS)

    def insert_with_ttl(self, name: str) -> str:
        """INSERT one message; Expires = database now + TTL.  Params:
        id, correlation_id, reply_to, *ttl_params, headers, body."""
        return (
            f"INSERT INTO {self.table(name)} ({self._insert_columns()}) "
            f"VALUES (%s, %s, %s, {self.true_literal}, {self.expires_after_ttl_sql()}, %s, %s)"
        )

    def insert_with_expires(self, name: str) -> str:
        """INSERT one message with an explicit Expires (or NULL).  Params:
        id, correlation_id, reply_to, expires, headers, body."""
        return (
            f"INSERT INTO {self.table(name)} ({self._insert_columns()}) "
            f"VALUES (%s, %s, %s, {self.true_literal}, %s, %s, %s)"
        )

    true_literal = "1"
    false_literal = "0"

    @abc.abstractmethod
    def receive(self, name: str) -> str:
        """Delete and return up to %s oldest messages not locked by other receivers."""

    def peek_estimate(self, name: str) -> str:
        """An estimate of the queue length without counting rows (max − min RowVersion)."""
        t = self.table(name)
        rv = self._col("RowVersion")
        return (
            f"SELECT COALESCE((SELECT MAX({rv}) FROM {t}) - (SELECT MIN({rv}) FROM {t}) + 1, 0)"
        )

    @abc.abstractmethod
    def browse(self, name: str) -> str:
        """Up to %s messages after RowVersion %s, oldest first, without taking them.
        Params: after_row_version, limit."""

    def browse_params(self, after_row_version: int, limit: int) -> list[Any]:
        return [after_row_version, limit]

    def counts(self, name: str) -> str:
        """One row: (total, expired)."""
        t = self.table(name)
        exp = self._col("Expires")
        return (
            f"SELECT (SELECT COUNT(*) FROM {t}), "
            f"(SELECT COUNT(*) FROM {t} WHERE {exp} IS NOT NULL AND {exp} <= {self.now_sql()})"
        )

    @abc.abstractmethod
    def delete_by_id(self, name: str) -> str:
        """Delete the message with Id %s unless a receiver holds it."""

    @abc.abstractmethod
    def purge_expired(self, name: str) -> str:
        """Delete up to %s expired rows, skipping locked ones; rowcount = rows deleted."""

    @abc.abstractmethod
    def purge_all(self, name: str) -> str:
        """Delete up to %s rows, skipping locked ones; rowcount = rows deleted."""

    def receive_expired(self, name: str) -> str:
        """Delete and return up to %s expired rows no receiver holds (for dead-lettering);
        columns as :meth:`receive`."""
        t = self.table(name)
        exp, rv = self._col("Expires"), self._col("RowVersion")
        return (
            f"DELETE FROM {t} WHERE {rv} IN (SELECT {rv} FROM {t} WHERE {exp} IS NOT NULL "
            f"AND {exp} <= {self.now_sql()} ORDER BY {exp} LIMIT %s{self.skip_locked_suffix}) "
            f"RETURNING {self._message_columns()}, {self.expired_sql()}"
        )

    def max_row_version(self, name: str) -> str:
        """One row: the newest RowVersion (NULL when empty)."""
        return f"SELECT MAX({self._col('RowVersion')}) FROM {self.table(name)}"

    def lock_table(self, name: str) -> str | None:
        """Lock a queue table against every other writer until the transaction ends
        (None: the transaction's own lock already does, as SQLite's BEGIN IMMEDIATE)."""
        return None

    # -- outbox tables (core/outbox.py) ------------------------------------------
    # Booleans are compared as ``= TRUE`` / ``= 1`` (never ``NOT col``) so a query's
    # predicate matches the partial indexes' WHERE clauses word for word.

    def outbox_index_names(self, name: str) -> dict[str, str]:
        """{'dispatched_at': …, 'undispatched': …}: the clean-up index and the stuck-record index."""
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        return {"dispatched_at": f"sluice_obd_{digest}", "undispatched": f"sluice_obu_{digest}"}

    @abc.abstractmethod
    def create_outbox_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that create an outbox table and its two indexes."""

    @abc.abstractmethod
    def before_now_sql(self) -> str:
        """SQL expression: the database's now minus the seconds given by :meth:`before_now_params`."""

    def before_now_params(self, seconds: float) -> list[Any]:
        return [seconds]

    def to_outbox_row(self, raw: tuple[Any, ...]) -> OutboxRow:
        mid, dispatched, dispatched_at, version, operations, created_at, quarantined, error = raw
        return OutboxRow(str(mid), bool(dispatched), self.to_datetime(dispatched_at), str(version),
                         operations if isinstance(operations, str) else bytes(operations).decode("utf-8", "replace"),
                         self.to_datetime(created_at), bool(quarantined), error)

    def _outbox_columns(self) -> str:
        return ", ".join(self._col(c) for c in OUTBOX_COLUMNS)

    def _is(self, column: str, value: bool) -> str:
        return f"{self._col(column)} = {self.true_literal if value else self.false_literal}"

    def outbox_states(self, name: str, count: int) -> str:
        """(MessageId, Dispatched, Quarantined) of the records among ``count`` ids (%s each)."""
        c = self._col
        return (f"SELECT {c('MessageId')}, {c('Dispatched')}, {c('Quarantined')} FROM {self.table(name)} "
                f"WHERE {c('MessageId')} IN ({', '.join(['%s'] * count)})")

    def outbox_insert(self, name: str, dispatched: bool) -> str:
        """INSERT a record.  Params: message_id, persistence_version, operations.  A record
        with nothing to send is stored dispatched at once: it is only de-duplication data."""
        c = self._col
        now = self.now_sql()
        return (
            f"INSERT INTO {self.table(name)} ({c('MessageId')}, {c('Dispatched')}, {c('DispatchedAt')}, "
            f"{c('PersistenceVersion')}, {c('Operations')}, {c('CreatedAt')}, {c('Quarantined')}) "
            f"VALUES (%s, {self.true_literal if dispatched else self.false_literal}, "
            f"{now if dispatched else 'NULL'}, %s, %s, {now}, {self.false_literal})"
        )

    def outbox_store_operations(self, name: str, dispatched: bool) -> str:
        """Fill in the operations of a record inserted first (pessimistic mode).
        Params: operations, message_id."""
        c = self._col
        return (
            f"UPDATE {self.table(name)} SET {c('Operations')} = %s, {self._is('Dispatched', dispatched)}, "
            f"{c('DispatchedAt')} = {self.now_sql() if dispatched else 'NULL'} WHERE {c('MessageId')} = %s"
        )

    def _claim_where(self, count: int, include_quarantined: bool) -> str:
        where = (f"{self._col('MessageId')} IN ({', '.join(['%s'] * count)}) "
                 f"AND {self._is('Dispatched', False)}")
        if not include_quarantined:
            where += f" AND {self._is('Quarantined', False)}"
        return where

    def outbox_mark_dispatched(self, name: str, count: int) -> str:
        """Set ``count`` records dispatched; their operations are replaced by %s (an empty
        list: a dispatched record is only de-duplication data).  Params: operations, ids."""
        c = self._col
        return (
            f"UPDATE {self.table(name)} SET {self._is('Dispatched', True)}, {c('DispatchedAt')} = {self.now_sql()}, "
            f"{c('Operations')} = %s, {self._is('Quarantined', False)}, {c('LastError')} = NULL "
            f"WHERE {c('MessageId')} IN ({', '.join(['%s'] * count)})"
        )

    def outbox_set_error(self, name: str, quarantine: bool) -> str:
        """Record why a dispatch failed (and quarantine the record).  Params: error, message_id."""
        c = self._col
        quarantined = f", {self._is('Quarantined', True)}" if quarantine else ""
        return f"UPDATE {self.table(name)} SET {c('LastError')} = %s{quarantined} WHERE {c('MessageId')} = %s"

    def outbox_due(self, name: str, include_failed: bool = True) -> str:
        """Ids of undispatched, unquarantined records created at least %s seconds ago
        (:meth:`before_now_params`), oldest first, at most %s."""
        c = self._col
        failed = "" if include_failed else f" AND {c('LastError')} IS NULL"
        return (
            f"SELECT {c('MessageId')} FROM {self.table(name)} WHERE {self._is('Dispatched', False)} "
            f"AND {self._is('Quarantined', False)}{failed} AND {c('CreatedAt')} <= {self.before_now_sql()} "
            f"ORDER BY {c('CreatedAt')} LIMIT %s"
        )

    @abc.abstractmethod
    def outbox_cleanup(self, name: str) -> str:
        """Delete up to a batch of dispatched records older than the retention, skipping
        locked rows; rowcount = records deleted.  Params: :meth:`outbox_cleanup_params`."""

    def outbox_cleanup_params(self, keep_seconds: float, batch_size: int) -> list[Any]:
        return [*self.before_now_params(keep_seconds), batch_size]

    def outbox_records(self, name: str, undispatched_only: bool) -> str:
        """Up to %s records: the undispatched ones oldest first, or all newest first."""
        where = f"WHERE {self._is('Dispatched', False)} " if undispatched_only else ""
        order = "ASC" if undispatched_only else "DESC"
        return (f"SELECT {self._outbox_columns()} FROM {self.table(name)} {where}"
                f"ORDER BY {self._col('CreatedAt')} {order} LIMIT %s")

    def outbox_record(self, name: str) -> str:
        """The record with MessageId %s."""
        return f"SELECT {self._outbox_columns()} FROM {self.table(name)} WHERE {self._col('MessageId')} = %s"

    def outbox_stats(self, name: str) -> str:
        """One row: (records, undispatched, quarantined, oldest undispatched CreatedAt, now)."""
        t = self.table(name)
        undispatched = self._is("Dispatched", False)
        return (
            f"SELECT (SELECT COUNT(*) FROM {t}), (SELECT COUNT(*) FROM {t} WHERE {undispatched}), "
            f"(SELECT COUNT(*) FROM {t} WHERE {undispatched} AND {self._is('Quarantined', True)}), "
            f"(SELECT MIN({self._col('CreatedAt')}) FROM {t} WHERE {undispatched}), {self.now_sql()}"
        )

    @abc.abstractmethod
    def outbox_size(self, name: str) -> tuple[str, list[Any]]:
        """One value: the bytes the table and its indexes take."""

    def outbox_data_size(self, name: str) -> tuple[str, list[Any]]:
        """One value: the bytes of the records' data (a fallback when the storage size is unknown)."""
        c = self._col
        return (
            f"SELECT COALESCE(SUM(LENGTH({c('MessageId')}) + LENGTH({c('Operations')}) + "
            f"COALESCE(LENGTH({c('LastError')}), 0) + LENGTH({c('PersistenceVersion')}) + 24), 0) "
            f"FROM {self.table(name)}",
            [],
        )

    # -- outbox phase-2 lease (core/outbox/dispatch.py; core-b, issue 11 defect 3) ----------
    # Phase 2 claims records by setting DispatchingUntil (database now + a short lease) in
    # a transaction of its own, publishes with no transaction open, then marks them
    # dispatched.  A claim passes over records whose lease has not run out, so a record
    # is published again only when its dispatcher died (or took longer than the lease).

    @abc.abstractmethod
    def outbox_lease_column_exists(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning a row when the outbox table has its DispatchingUntil column."""

    @abc.abstractmethod
    def outbox_add_lease_column(self, name: str) -> str:
        """ALTER TABLE adding the nullable DispatchingUntil column (tables made before it)."""

    @abc.abstractmethod
    def outbox_claim_lease(self, name: str, count: int, include_quarantined: bool = False) -> str:
        """Lease the undispatched records among ``count`` ids whose lease is unset or over:
        DispatchingUntil = now + the lease, skipping rows other transactions hold.  Params:
        ``ttl_params(lease seconds)``, then the ids.  Returns (MessageId, Operations,
        CreatedAt, the database's now) of each record leased."""

    def _lease_free(self) -> str:
        c = self._col
        return f"({c('DispatchingUntil')} IS NULL OR {c('DispatchingUntil')} <= {self.now_sql()})"

    def outbox_release(self, name: str, count: int) -> str:
        """End the lease of ``count`` records (%s each): a failed dispatch may be retried at once."""
        c = self._col
        return (f"UPDATE {self.table(name)} SET {c('DispatchingUntil')} = NULL "
                f"WHERE {c('MessageId')} IN ({', '.join(['%s'] * count)})")


def _is_uuid(value: Any) -> bool:
    if isinstance(value, uuid.UUID):
        return True
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


class DelayedSQL(abc.ABC):
    """Named SQL of the delayed-message store (table ``Id, Destination, State, Time,
    Headers, RetryCount`` with an index on Time).  Mixed into every dialect; the
    generic forms below are overridden where a database differs."""

    # Provided by Dialect.
    table: Any
    quote: Any
    now_sql: Any
    skip_locked_suffix: str

    def _delayed_columns(self) -> str:
        return ", ".join(self.quote(c) for c in DELAYED_COLUMNS)

    @abc.abstractmethod
    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that create the store table and its index on Time."""

    def delayed_insert_at(self, name: str) -> str:
        """Store a message due at an explicit time, unless its Id is already stored.
        Params: id, destination, state, time, headers.  Returns the stored Time (no row
        when the Id was already there)."""
        return (
            f"INSERT INTO {self.table(name)} ({self._delayed_columns()}) VALUES (%s, %s, %s, %s, %s, 0) "
            f"ON CONFLICT ({self.quote('Id')}) DO NOTHING RETURNING {self.quote('Time')}"
        )

    def delayed_insert_after(self, name: str) -> str:
        """Like delayed_insert_at, due at database now + a delay given by ttl_params."""
        return (
            f"INSERT INTO {self.table(name)} ({self._delayed_columns()}) "
            f"VALUES (%s, %s, %s, {self.expires_after_ttl_sql()}, %s, 0) "
            f"ON CONFLICT ({self.quote('Id')}) DO NOTHING RETURNING {self.quote('Time')}"
        )

    def delayed_insert_params(self, id_: str, destination: str, state: bytes, time_params: list[Any],
                              headers: str) -> list[Any]:
        return [id_, destination, state, *time_params, headers]

    def delayed_fetch_due(self, name: str) -> str:
        """Up to N messages due at a time (NULL: the database's now), earliest first,
        locked against other movers.  Params: delayed_fetch_params(at, limit)."""
        time = self.quote("Time")
        return (
            f"SELECT {self._delayed_columns()} FROM {self.table(name)} "
            f"WHERE {time} <= COALESCE(%s, {self.now_sql()}) ORDER BY {time} LIMIT %s{self.skip_locked_suffix}"
        )

    def delayed_fetch_params(self, at: Any, limit: int) -> list[Any]:
        return [at, limit]

    def delayed_remove(self, name: str) -> str:
        return f"DELETE FROM {self.table(name)} WHERE {self.quote('Id')} = %s"

    def delayed_remove_many(self, name: str, count: int) -> str:
        """Delete ``count`` stored messages by Id in one statement.  Params: the ids
        (callers keep ``count`` within ``max_parameters``)."""
        marks = ", ".join(["%s"] * count)
        return f"DELETE FROM {self.table(name)} WHERE {self.quote('Id')} IN ({marks})"

    def delayed_increment_failure(self, name: str) -> str:
        rc = self.quote("RetryCount")
        return f"UPDATE {self.table(name)} SET {rc} = {rc} + 1 WHERE {self.quote('Id')} = %s"

    def delayed_next(self, name: str) -> str:
        """One row: (earliest due time or NULL, the database's now)."""
        return f"SELECT (SELECT MIN({self.quote('Time')}) FROM {self.table(name)}), {self.now_sql()}"

    def delayed_list(self, name: str) -> str:
        """Up to %s stored messages by due time, with the database's now.  Not locked."""
        return (
            f"SELECT {self._delayed_columns()}, {self.now_sql()} FROM {self.table(name)} "
            f"ORDER BY {self.quote('Time')}, {self.quote('Id')} LIMIT %s"
        )

    def delayed_deliver_now(self, name: str) -> str:
        """Make one stored message due now.  Params: id."""
        return f"UPDATE {self.table(name)} SET {self.quote('Time')} = {self.now_sql()} WHERE {self.quote('Id')} = %s"

    def rename_delayed_table(self, old: str, new: str) -> list[tuple[str, list[Any]]]:
        """Rename a store table (keeping its rows) and drop its old-named index; the
        create statements then make the index under its new name."""
        index = self.quote(self.delayed_time_index(old))
        if self.schema:
            index = f"{self.quote(self.schema)}.{index}"
        return [(f"ALTER TABLE {self.table(old)} RENAME TO {self.quote(new)}", []),
                (f"DROP INDEX IF EXISTS {index}", [])]

    def delayed_has_destination(self, name: str) -> str:
        """A row when some stored message is for destination %s."""
        return f"SELECT 1 FROM {self.table(name)} WHERE {self.quote('Destination')} = %s"

    def notify(self) -> str | None:
        """A statement that wakes listeners on channel %s with payload %s at commit."""
        return None
