"""Named SQL of the outbox tables (core/outbox): mixed into every dialect.

Booleans are compared as ``= TRUE`` / ``= 1`` (never ``NOT col``) so a query's predicate
matches the partial indexes' WHERE clauses word for word.
"""
from __future__ import annotations

import abc
import datetime as dt
import hashlib
from typing import Any, NamedTuple

#: Columns of an outbox table.  The first five are the outbox's own (MessageId, the
#: incoming message or session id, is the primary key); CreatedAt ages stuck records,
#: Quarantined/LastError keep a record that cannot be dispatched visible instead of lost.
OUTBOX_COLUMNS = ("MessageId", "Dispatched", "DispatchedAt", "PersistenceVersion", "Operations",
                  "CreatedAt", "Quarantined", "LastError")


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


class OutboxSQL(abc.ABC):
    """The outbox's statements; the fragments and helpers come from :class:`Dialect`."""

    # Provided by Dialect.
    table: Any
    quote: Any
    _col: Any
    now_sql: Any
    to_datetime: Any
    ttl_params: Any
    true_literal: str
    false_literal: str
    limit: str
    readpast_hint: str
    nolock_hint: str
    lock_skip_hint: str
    skip_locked_suffix: str

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

    def outbox_insert(self, name: str, dispatched: bool, count: int = 1) -> str:
        """INSERT ``count`` records (one statement).  Params per record: message_id,
        persistence_version, operations.  A record with nothing to send is stored
        dispatched at once: it is only de-duplication data."""
        c = self._col
        now = self.now_sql()
        row = (f"(%s, {self.true_literal if dispatched else self.false_literal}, "
               f"{now if dispatched else 'NULL'}, %s, %s, {now}, {self.false_literal})")
        return (
            f"INSERT INTO {self.table(name)} ({c('MessageId')}, {c('Dispatched')}, {c('DispatchedAt')}, "
            f"{c('PersistenceVersion')}, {c('Operations')}, {c('CreatedAt')}, {c('Quarantined')}) "
            f"VALUES {', '.join([row] * count)}"
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

    def _held_by(self) -> str:
        """The lease condition of every phase-2 state change: still leased by the claim
        whose token is %s (a dispatcher whose lease ran out and was taken over changes
        nothing: it neither marks, nor records its error, nor ends its successor's lease).

        The token alone decides; no ``Dispatched = false`` beside it.  A record holding a
        token is undispatched: only a claim sets one, and it claims undispatched records
        only (:meth:`_claim_where`); the mark that dispatches a record ends its lease in
        the same statement; a record stored dispatched (phase 1) never had one.  A
        seeded mutation dropping that condition changed nothing any test or the model
        could see, because nothing could."""
        return f"{self._col('DispatchToken')} = %s"

    def _lease_ended(self) -> str:
        c = self._col
        return f"{c('DispatchingUntil')} = NULL, {c('DispatchToken')} = NULL"

    def outbox_mark_dispatched(self, name: str, count: int) -> str:
        """Set the records among ``count`` ids that the lease token still holds dispatched;
        their operations are replaced by %s (an empty list: a dispatched record is only
        de-duplication data).  Params: operations, ids, token.  Returns the MessageId of
        each record marked (a compare-and-set: the others belong to another dispatcher)."""
        c = self._col
        assignments = (f"{self._is('Dispatched', True)}, {c('DispatchedAt')} = {self.now_sql()}, "
                       f"{c('Operations')} = %s, {self._is('Quarantined', False)}, {c('LastError')} = NULL, "
                       f"{self._lease_ended()}")
        where = f"{c('MessageId')} IN ({', '.join(['%s'] * count)}) AND {self._held_by()}"
        return self.update_returning(name, assignments, where, ["MessageId"])

    def outbox_fail(self, name: str, quarantine: bool) -> str:
        """Record why a dispatch failed (and quarantine the record) and end its lease, so
        the next scan retries it; only while the lease token still holds the record.
        Params: error, message_id, token.  rowcount 1 when it did."""
        c = self._col
        quarantined = f", {self._is('Quarantined', True)}" if quarantine else ""
        return (f"UPDATE {self.table(name)} SET {c('LastError')} = %s{quarantined}, {self._lease_ended()} "
                f"WHERE {c('MessageId')} = %s AND {self._held_by()}")

    def update_returning(self, name: str, assignments: str, where: str, columns: list[str]) -> str:
        """``UPDATE name SET assignments WHERE where`` returning ``columns`` of the rows it
        changed (RETURNING; SQL Server says OUTPUT)."""
        returned = ", ".join(self._col(column) for column in columns)
        return f"UPDATE {self.table(name)} SET {assignments} WHERE {where} RETURNING {returned}"

    def outbox_due(self, name: str, include_failed: bool = True) -> str:
        """Ids of undispatched, unquarantined records created at least %s seconds ago
        (:meth:`before_now_params`), oldest first, at most %s."""
        c = self._col
        failed = "" if include_failed else f" AND {c('LastError')} IS NULL"
        return (
            f"SELECT {c('MessageId')} FROM {self.table(name)}{self.readpast_hint} WHERE {self._is('Dispatched', False)} "
            f"AND {self._is('Quarantined', False)}{failed} AND {c('CreatedAt')} <= {self.before_now_sql()} "
            f"ORDER BY {c('CreatedAt')}{self.limit}"
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
        return (f"SELECT {self._outbox_columns()} FROM {self.table(name)}{self.readpast_hint} {where}"
                f"ORDER BY {self._col('CreatedAt')} {order}{self.limit}")

    def outbox_record(self, name: str) -> str:
        """The record with MessageId %s."""
        return f"SELECT {self._outbox_columns()} FROM {self.table(name)} WHERE {self._col('MessageId')} = %s"

    def outbox_stats(self, name: str, capped: bool = False) -> str:
        """One row: (records, undispatched, quarantined, oldest undispatched CreatedAt, now).
        ``capped`` (the dashboard): each count stops at a cap, three %s parameters."""
        t = f"{self.table(name)}{self.nolock_hint}"
        undispatched = self._is("Dispatched", False)
        wheres = ("", f" WHERE {undispatched}", f" WHERE {undispatched} AND {self._is('Quarantined', True)}")
        counts = [self._capped_count(t, w) if capped else f"(SELECT COUNT(*) FROM {t}{w})" for w in wheres]
        return (
            f"SELECT {', '.join(counts)}, "
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
    # Each claim also writes a token of its own, and the mark and the failure write only
    # where the token is still theirs: a dispatcher that outlived its lease changes
    # nothing its successor owns, so local operations happen once whatever the timing.

    #: The lease's columns, added by setup to tables made before them: when the lease
    #: ends, and whose it is (a token each claim draws; defect 3 of issue 18).
    LEASE_COLUMNS = ("DispatchingUntil", "DispatchToken")

    @abc.abstractmethod
    def outbox_column_exists(self, name: str, column: str) -> tuple[str, list[Any]]:
        """SELECT returning a row when the outbox table has ``column`` (one of :data:`LEASE_COLUMNS`)."""

    @abc.abstractmethod
    def outbox_add_column(self, name: str, column: str) -> str:
        """ALTER TABLE adding the nullable ``column`` (one of :data:`LEASE_COLUMNS`)."""

    def outbox_lease_column_exists(self, name: str) -> tuple[str, list[Any]]:
        """SELECT returning a row when the outbox table has its DispatchingUntil column."""
        return self.outbox_column_exists(name, "DispatchingUntil")

    def outbox_add_lease_column(self, name: str) -> str:
        """ALTER TABLE adding the nullable DispatchingUntil column (tables made before it)."""
        return self.outbox_add_column(name, "DispatchingUntil")

    @abc.abstractmethod
    def outbox_claim_lease(self, name: str, count: int, include_quarantined: bool = False) -> str:
        """Lease the undispatched records among ``count`` ids whose lease is unset or over:
        DispatchingUntil = now + the lease and DispatchToken = the claim's token, skipping
        rows other transactions hold.  Params: ``ttl_params(lease seconds)``, the token,
        then the ids.  Returns (MessageId, Operations, CreatedAt, the database's now) of
        each record leased."""

    def _lease_free(self) -> str:
        c = self._col
        return f"({c('DispatchingUntil')} IS NULL OR {c('DispatchingUntil')} <= {self.now_sql()})"


class MSSQLOutboxSQL(OutboxSQL):
    """SQL Server's outbox statements (core.dialects.mssql mixes them in): a table with a
    nonclustered key, ``DELETE TOP``, ``OUTPUT`` and READPAST where the others use LIMIT,
    RETURNING and SKIP LOCKED."""

    def outbox_index_names(self, name: str) -> dict[str, str]:
        return {"dispatched_at": "Index_DispatchedAt", "undispatched": "Index_Undispatched"}

    def create_outbox_table(self, name: str) -> list[tuple[str, list[Any]]]:
        t = self.table(name)
        idx = self.outbox_index_names(name)
        return self.create_schema() + [
            (
                # NONCLUSTERED primary key: message ids are random, and a clustered index
                # on them would split pages on every insert (the queue tables are heaps
                # for the same kind of reason).  Constraint names are unique per schema.
                "IF OBJECT_ID(%s, N'U') IS NULL "
                f"CREATE TABLE {t} ("
                "[MessageId] nvarchar(200) NOT NULL, "
                "[Dispatched] bit NOT NULL DEFAULT 0, "
                "[DispatchedAt] datetime2 NULL, "
                "[PersistenceVersion] varchar(23) NOT NULL, "
                "[Operations] nvarchar(max) NOT NULL, "
                "[CreatedAt] datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), "
                "[Quarantined] bit NOT NULL DEFAULT 0, "
                "[LastError] nvarchar(max) NULL, "
                f"CONSTRAINT {self.quote('PK_' + name)} PRIMARY KEY NONCLUSTERED ([MessageId]))",
                [t],
            ),
            (
                "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = %s AND object_id = OBJECT_ID(%s)) "
                f"CREATE NONCLUSTERED INDEX {self.quote(idx['dispatched_at'])} ON {t} ([DispatchedAt] ASC) "
                "WHERE [Dispatched] = 1",
                [idx["dispatched_at"], t],
            ),
            (
                "IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = %s AND object_id = OBJECT_ID(%s)) "
                f"CREATE NONCLUSTERED INDEX {self.quote(idx['undispatched'])} ON {t} ([CreatedAt] ASC) "
                "WHERE [Dispatched] = 0",
                [idx["undispatched"], t],
            ),
        ]

    def before_now_sql(self) -> str:
        # Same split as ttl_params (milliseconds left over, whole minutes): no int overflow.
        return "DATEADD(millisecond, -%s, DATEADD(minute, -%s, GETUTCDATE()))"

    def before_now_params(self, seconds: float) -> list[Any]:
        return self.ttl_params(seconds)

    def outbox_cleanup(self, name: str) -> str:
        return (
            f"DELETE TOP (%s) FROM {self.table(name)} WITH (ROWLOCK, READPAST) "
            f"WHERE [Dispatched] = 1 AND [DispatchedAt] <= {self.before_now_sql()}"
        )

    def outbox_cleanup_params(self, keep_seconds: float, batch_size: int) -> list[Any]:
        return [batch_size, *self.before_now_params(keep_seconds)]

    def outbox_size(self, name: str) -> tuple[str, list[Any]]:
        return ("SELECT ISNULL(SUM(reserved_page_count), 0) * 8192 FROM sys.dm_db_partition_stats "
                "WHERE object_id = OBJECT_ID(%s)", [self.table(name)])

    def outbox_data_size(self, name: str) -> tuple[str, list[Any]]:
        return (
            "SELECT ISNULL(SUM(DATALENGTH([MessageId]) + DATALENGTH([Operations]) + "
            "ISNULL(DATALENGTH([LastError]), 0) + DATALENGTH([PersistenceVersion]) + 24), 0) "
            f"FROM {self.table(name)} WITH (NOLOCK)",
            [],
        )

    # -- outbox phase-2 lease (core-b; see Dialect.outbox_claim_lease) -------------------
    OUTBOX_LEASE_COLUMN_TYPES = {"DispatchingUntil": "datetime2", "DispatchToken": "varchar(36)"}

    def outbox_column_exists(self, name: str, column: str) -> tuple[str, list[Any]]:
        return ("SELECT 1 WHERE COL_LENGTH(%s, %s) IS NOT NULL", [self.table(name), column])

    def outbox_add_column(self, name: str, column: str) -> str:
        return f"ALTER TABLE {self.table(name)} ADD {self.quote(column)} {self.OUTBOX_LEASE_COLUMN_TYPES[column]} NULL"

    def update_returning(self, name: str, assignments: str, where: str, columns: list[str]) -> str:
        returned = ", ".join(f"inserted.{self._col(column)}" for column in columns)
        return f"UPDATE {self.table(name)} SET {assignments} OUTPUT {returned} WHERE {where}"

    def outbox_claim_lease(self, name: str, count: int, include_quarantined: bool = False) -> str:
        # ROWLOCK + READPAST: take row locks only, pass over records another dispatcher is
        # claiming (the SKIP LOCKED of SQL Server); OUTPUT returns what was leased.
        return (f"UPDATE {self.table(name)} WITH (ROWLOCK, READPAST) "
                f"SET [DispatchingUntil] = {self.expires_after_ttl_sql()}, [DispatchToken] = %s "
                f"OUTPUT inserted.[MessageId], inserted.[Operations], inserted.[CreatedAt], {self.now_sql()} "
                f"WHERE {self._claim_where(count, include_quarantined)} AND {self._lease_free()}")
