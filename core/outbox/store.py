"""The outbox table of one database alias: its name, creation, and every statement on it
(each one named SQL from the dialect)."""
from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass
from typing import Sequence

from django.db import DatabaseError, IntegrityError, connections, transaction

from core.conf import get_settings
from core.dialects import Dialect, OutboxRow, dialect_for
from core.errors import ConfigurationError, SluiceError
from core.messages import storable_text
from core.outbox.operations import EMPTY_OPERATIONS

log = logging.getLogger("sluice.outbox")

#: Written to every record's PersistenceVersion: who stored it, in which format.
PERSISTENCE_VERSION = "sluice-outbox-1"
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
MAX_TABLE_NAME_LENGTH = 60


class OutboxConflict(SluiceError):
    """Internal: the record's primary key was taken by a concurrent copy of the message."""


def outbox_table(settings=None) -> str:
    """The outbox table of this endpoint: SLUICE_OUTBOX_TABLE or ``sluice_outbox_<ENDPOINT>``.

    The ``sluice_`` prefix keeps it out of the queue namespace (queue names cannot start
    with it).  Validated like queue names, and always quoted in SQL."""
    s = settings or get_settings()
    name = s.outbox_table
    if len(name) > MAX_TABLE_NAME_LENGTH or not TABLE_NAME_RE.match(name):
        raise ConfigurationError(
            f"outbox table name {name!r} must be 1–{MAX_TABLE_NAME_LENGTH} letters, digits, '_', '.' or '-' "
            "(set SLUICE_OUTBOX_TABLE, or shorten SLUICE_ENDPOINT)"
        )
    return name


def create_outbox_table(using: str | None = None, table: str | None = None) -> tuple[str, bool]:
    """Create the outbox table and its indexes, and add the lease columns (DispatchingUntil,
    DispatchToken) to a table made before them; idempotent and safe when several processes do it at once (the
    dialect's DDL lock).  Returns (table, created)."""
    store = OutboxStore(using, table)
    created = not store.exists()
    d = store.dialect
    with transaction.atomic(using=store.using), connections[store.using].cursor() as cursor:
        lock = d.ddl_lock()
        if lock:
            cursor.execute(*lock)
        for sql, params in d.create_outbox_table(store.table):
            cursor.execute(sql, params)
        for column in d.LEASE_COLUMNS:
            cursor.execute(*d.outbox_column_exists(store.table, column))
            if cursor.fetchone() is None:
                cursor.execute(d.outbox_add_column(store.table, column), [])
                if not created:
                    log.info("outbox table %s: added %s (the phase-2 lease)", store.table, column)
    if created:
        log.info("created outbox table %s", store.table)
    return store.table, created


@dataclass(frozen=True)
class OutboxStats:
    table: str
    records: int
    undispatched: int
    quarantined: int
    bytes: int
    oldest_undispatched_age_s: float | None
    #: Counts stop at this many (a count above it means "more than"); None: exact.
    count_cap: int | None = None


@dataclass(frozen=True)
class Claimed:
    """A record leased for dispatch."""

    message_id: str
    operations: str
    #: Seconds since the record was stored, by the database's clock (delays count from then).
    age_s: float


class OutboxStore:
    """The outbox table of one database alias: every statement comes from the dialect."""

    def __init__(self, using: str | None = None, table: str | None = None) -> None:
        self.using = using or get_settings().DATABASE
        self.table = table or outbox_table()
        self._dialect: Dialect | None = None

    @property
    def dialect(self) -> Dialect:
        # Fixed for an alias; looked up once (this is on the per-message path).
        if self._dialect is None:
            self._dialect = dialect_for(connections[self.using], get_settings().SCHEMA)
        return self._dialect

    def _cursor(self):
        return connections[self.using].cursor()

    def exists(self) -> bool:
        with self._cursor() as cursor:
            cursor.execute(*self.dialect.table_exists(self.table))
            return cursor.fetchone() is not None

    def require(self) -> None:
        if not self.exists():
            raise ConfigurationError(
                f"the outbox table {self.table} does not exist on database {self.using!r}; run `sluice setup`")

    def missing_indexes(self) -> list[str]:
        with self._cursor() as cursor:
            cursor.execute(*self.dialect.existing_indexes(self.table))
            present = {row[0] for row in cursor.fetchall()}
        missing = [idx for idx in self.dialect.outbox_index_names(self.table).values() if idx not in present]
        if missing:
            log.warning("outbox table %s is missing index(es) %s; `sluice setup` creates them",
                        self.table, ", ".join(missing))
        return missing

    # -- phase 1 --
    def states(self, message_ids: list[str]) -> dict[str, tuple[bool, bool]]:
        """{message_id: (dispatched, quarantined)} of the records that exist among the ids."""
        if not message_ids:
            return {}
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_states(self.table, len(message_ids)), list(message_ids))
            return {str(mid): (bool(dispatched), bool(quarantined)) for mid, dispatched, quarantined in cursor.fetchall()}

    def state(self, message_id: str) -> tuple[bool, bool] | None:
        """(dispatched, quarantined) of a record, or None when there is none."""
        return self.states([message_id]).get(message_id)

    def insert(self, message_id: str, operations: str, dispatched: bool) -> None:
        """Insert a record; OutboxConflict when its MessageId is taken.

        Call inside a savepoint: after a key violation PostgreSQL refuses further
        statements until the transaction rolls back to one."""
        self.insert_many([(message_id, operations, dispatched)])

    def insert_many(self, records: Sequence[tuple[str, str, bool]]) -> None:
        """Insert records given as (message_id, operations, dispatched): one statement
        for those stored dispatched and one for the rest (within the dialect's parameter
        limit).  OutboxConflict when a MessageId is taken; call inside a savepoint."""
        d = self.dialect
        size = max(1, d.max_parameters // 3)
        try:
            with self._cursor() as cursor:
                for dispatched in (False, True):
                    rows = [(mid, PERSISTENCE_VERSION, ops) for mid, ops, done in records if done is dispatched]
                    for start in range(0, len(rows), size):
                        part = rows[start:start + size]
                        cursor.execute(d.outbox_insert(self.table, dispatched, len(part)),
                                       [value for row in part for value in row])
        except IntegrityError as exc:
            raise OutboxConflict(f"an outbox record among {len(records)} exists: {exc}") from exc

    def store_operations(self, message_id: str, operations: str, dispatched: bool) -> None:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_store_operations(self.table, dispatched), [operations, message_id])

    # -- phase 2 --
    def claim(self, message_ids: list[str], lease_seconds: float, token: str,
              include_quarantined: bool = False) -> list[Claimed]:
        """Lease the undispatched records among ``message_ids`` for ``lease_seconds`` (the
        database's clock) under ``token``, passing over records another dispatcher holds
        or has leased.  Commit the lease before publishing anything."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_claim_lease(self.table, len(message_ids), include_quarantined),
                           [*d.ttl_params(lease_seconds), token, *message_ids])
            rows = cursor.fetchall()
        order = {mid: i for i, mid in enumerate(message_ids)}
        claimed = [Claimed(str(mid), ops if isinstance(ops, str) else bytes(ops).decode("utf-8", "replace"),
                           _seconds_between(d.to_datetime(created), d.to_datetime(now)))
                   for mid, ops, created, now in rows]
        return sorted(claimed, key=lambda r: order.get(r.message_id, 0))

    def mark_dispatched(self, message_ids: list[str], token: str) -> set[str]:
        """Mark the records ``token`` still leases dispatched (compare-and-set); the ids
        marked.  A record missing from the answer was taken over by another dispatcher."""
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_mark_dispatched(self.table, len(message_ids)),
                           [EMPTY_OPERATIONS, *message_ids, token])
            return {str(row[0]) for row in cursor.fetchall()}

    def fail(self, message_id: str, error: str, token: str, quarantine: bool = False) -> bool:
        """Keep a record undispatched with its LastError (quarantined if asked) and end
        its lease; False when ``token`` no longer leases it (nothing was changed)."""
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_fail(self.table, quarantine), [storable_text(error[:4000]), message_id, token])
            return cursor.rowcount == 1

    def due(self, grace_seconds: float, limit: int, include_failed: bool = True) -> list[str]:
        """Ids of undispatched, unquarantined records older than ``grace_seconds``, oldest first."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_due(self.table, include_failed), [*d.before_now_params(grace_seconds), limit])
            return [str(row[0]) for row in cursor.fetchall()]

    # -- retention and operators --
    def cleanup_batch(self, keep_seconds: float, batch_size: int) -> int:
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_cleanup(self.table), d.outbox_cleanup_params(keep_seconds, batch_size))
            return max(cursor.rowcount, 0)

    def records(self, undispatched_only: bool = False, limit: int = 50) -> list[OutboxRow]:
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_records(self.table, undispatched_only), [limit])
            return [d.to_outbox_row(raw) for raw in cursor.fetchall()]

    def record(self, message_id: str) -> OutboxRow | None:
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_record(self.table), [message_id])
            raw = cursor.fetchone()
        return None if raw is None else d.to_outbox_row(raw)

    def stats(self, cap: int | None = None) -> OutboxStats:
        """Counts, size and the oldest undispatched record's age.  ``cap`` (a page on a big
        table): each count stops just past it, so it reads at most that many index entries."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_stats(self.table, capped=cap is not None), [] if cap is None else [cap + 1] * 3)
            records, undispatched, quarantined, oldest, now = cursor.fetchone()
        age = None if oldest is None else _seconds_between(d.to_datetime(oldest), d.to_datetime(now))
        return OutboxStats(self.table, int(records), int(undispatched or 0), int(quarantined or 0),
                           self.size(), age, cap)

    def size(self) -> int:
        """Bytes the table takes; the data's own size where the database cannot say."""
        d = self.dialect
        try:
            with transaction.atomic(using=self.using), self._cursor() as cursor:
                cursor.execute(*d.outbox_size(self.table))
                return int(cursor.fetchone()[0] or 0)
        except DatabaseError:
            with self._cursor() as cursor:
                cursor.execute(*d.outbox_data_size(self.table))
                return int(cursor.fetchone()[0] or 0)


def _seconds_between(earlier: dt.datetime | None, later: dt.datetime | None) -> float:
    """Non-negative seconds between two instants the database gave (0 when one is missing)."""
    if earlier is None or later is None:
        return 0.0
    return max((later - earlier).total_seconds(), 0.0)
