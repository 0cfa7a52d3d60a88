"""The dialect interface: capability flags and named SQL for queue tables.

Column order of every statement that returns messages is :data:`MESSAGE_COLUMNS`
followed by an ``expired`` flag computed by the database's own clock.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from typing import Any, NamedTuple

#: Columns of a queue table, as the SQL transport lays them out.
COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers", "Body", "RowVersion")
#: Columns a receive / browse returns, in this order, then the expired flag.
MESSAGE_COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Expires", "Headers", "Body", "RowVersion")


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


class Dialect:
    """Base class: shared helpers; subclasses fill in flags and SQL (DelayedSQL is mixed in
    by each dialect)."""

    vendor: str = ""
    #: A receive can skip rows locked by another receiver (row-level locking).
    supports_skip_locked: bool = True
    #: Several connections can write at once (False: one writer at a time, SQLite).
    supports_concurrent_writers: bool = True
    #: Indexes may carry a WHERE clause (filtered / partial index).
    supports_partial_indexes: bool = True
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

    # -- named SQL: subclasses provide these -----------------------------------
    def create_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that create the table and its indexes."""
        raise NotImplementedError

    def ddl_lock(self) -> tuple[str, list[Any]] | None:
        """A statement that serialises DDL across processes for this transaction."""
        return None

    def drop_queue_table(self, name: str) -> list[tuple[str, list[Any]]]:
        raise NotImplementedError

    def existing_indexes(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning one row per index name on the queue table."""
        raise NotImplementedError

    def table_exists(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning a row when the queue table exists."""
        raise NotImplementedError

    def now_sql(self) -> str:
        """SQL expression for the database's current UTC time."""
        raise NotImplementedError

    def expires_after_ttl_sql(self) -> str:
        """SQL expression: now + a TTL given by :meth:`ttl_params`."""
        raise NotImplementedError

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

    def receive(self, name: str) -> str:
        """Delete and return up to %s oldest messages not locked by other receivers."""
        raise NotImplementedError

    def peek_estimate(self, name: str) -> str:
        """An estimate of the queue length without counting rows (max − min RowVersion)."""
        t = self.table(name)
        rv = self._col("RowVersion")
        return (
            f"SELECT COALESCE((SELECT MAX({rv}) FROM {t}) - (SELECT MIN({rv}) FROM {t}) + 1, 0)"
        )

    def browse(self, name: str) -> str:
        """Up to %s messages after RowVersion %s, oldest first, without taking them.
        Params: after_row_version, limit."""
        raise NotImplementedError

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

    def delete_by_id(self, name: str) -> str:
        """Delete the message with Id %s unless a receiver holds it."""
        raise NotImplementedError

    def purge_expired(self, name: str) -> str:
        """Delete up to %s expired rows, skipping locked ones; rowcount = rows deleted."""
        raise NotImplementedError

    def purge_all(self, name: str) -> str:
        """Delete up to %s rows, skipping locked ones; rowcount = rows deleted."""
        raise NotImplementedError

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


def _is_uuid(value: Any) -> bool:
    if isinstance(value, uuid.UUID):
        return True
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


class DelayedSQL:
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

    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        raise NotImplementedError

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

    def delayed_has_destination(self, name: str) -> str:
        """A row when some stored message is for destination %s."""
        return f"SELECT 1 FROM {self.table(name)} WHERE {self.quote('Destination')} = %s"

    def notify(self) -> str | None:
        """A statement that wakes listeners on channel %s with payload %s at commit."""
        return None
