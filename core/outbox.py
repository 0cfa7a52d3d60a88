"""The outbox (SPEC C4): exactly-once processing when outgoing messages leave this database.

Phase 1 runs inside the pump's receive transaction (or the caller's, for a session):

1. de-duplicate: a record for the incoming MessageId means the message was processed
   already — skip the handler and go to phase 2;
2. run the handler; its outgoing messages are collected, not sent (:class:`OutboxSender`);
3. store them in the outbox record, in the same transaction as the business writes;
4. commit.  On a SQL transport the *acknowledge* (the receive's DELETE of the incoming
   row) commits here too, with the business writes and the outbox record.

Phase 2, after the commit, in a short transaction of its own per batch of records:
claim the undispatched records (row locks that skip records another process holds),
dispatch their operations, mark them dispatched, commit.  Operations to a queue in the
outbox's own database are inserted in that same transaction, so they happen exactly once;
operations to another database or to Celery happen before the commit, so a crash between
the two repeats them — with the same message ids, for the receivers' outboxes to absorb.

Why the acknowledge is in phase 1 and not after phase 2, as the reference orders it: the
reference acknowledges last so that a crash after the commit redelivers the incoming
message, whose phase-1 lookup then finds the record and finishes phase 2.  Here the
incoming row is deleted by the same database transaction that stores the record, so it
cannot be acknowledged without its record existing, and :class:`OutboxDispatcher`
finishes any record a crash left undispatched (as it does for transactional sessions,
which have no incoming message to redeliver).  A duplicate that arrives while a record is
still undispatched finishes phase 2 itself, exactly as the reference describes.

Concurrency control (SLUICE_OUTBOX_CONCURRENCY_CONTROL):

- ``optimistic`` (default): the record is inserted after the handler; when two copies of
  a message are processed at once, the second insert hits the primary key, its handler's
  work rolls back and the copy counts as a duplicate.
- ``pessimistic``: the record is inserted *before* the handler; the second copy's insert
  waits on that row's lock until the first commits, then finds the key taken — its
  handler never runs.  Costs an UPDATE per message; worth it for expensive handlers or
  ones with side effects outside the database.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import random
import re
import signal
import sys
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from django.db import DatabaseError, IntegrityError, connections, transaction

from core.conf import get_settings
from core.dialects import Dialect, OutboxRow, dialect_for
from core.errors import ConfigurationError, InvalidMessage, SluiceError
from core.outbox_ops import (
    EMPTY_OPERATIONS,
    QUEUE,
    OutboxSender,
    UnknownDestination,
    UnreadableOperations,
    decode_operations,
    destination,
    outgoing_message,
    register_destination,
)
from core.queues import registry
from core.transport import MAX_MESSAGE_ID_LENGTH, Transport

__all__ = [
    "Outbox", "OutboxSession", "OutboxDispatcher", "OutboxCleanup", "OutboxSender", "OutboxStore",
    "DuplicateMessage", "UnknownDestination", "UnreadableOperations", "register_destination",
    "collector_for", "create_outbox_table", "outbox_table", "retention_warnings", "worker_loops",
]

log = logging.getLogger("sluice.outbox")

#: Written to every record's PersistenceVersion: who stored it, in which format.
PERSISTENCE_VERSION = "sluice-outbox-1"
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
MAX_TABLE_NAME_LENGTH = 60
#: Records claimed by one phase-2 transaction.
DISPATCH_CHUNK = 100
#: Clean-up statements one OutboxCleanup step runs at most before yielding.
MAX_CLEANUP_BATCHES_PER_STEP = 25
FAULT_POINTS = ("in_handler", "after_commit", "after_dispatch")


class DuplicateMessage(SluiceError):
    """A transactional session's message id was processed already (its messages were sent)."""


class OutboxConflict(SluiceError):
    """Internal: the record's primary key was taken by a concurrent copy of the message."""


# -- the table -----------------------------------------------------------------------------


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
    """Create the outbox table and its indexes; idempotent and safe when several processes
    do it at once (the dialect's DDL lock).  Returns (table, created)."""
    store = OutboxStore(using, table)
    created = not store.exists()
    with transaction.atomic(using=store.using), connections[store.using].cursor() as cursor:
        lock = store.dialect.ddl_lock()
        if lock:
            cursor.execute(*lock)
        for sql, params in store.dialect.create_outbox_table(store.table):
            cursor.execute(sql, params)
    if created:
        log.info("created outbox table %s", store.table)
    return store.table, created


# -- storage -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxStats:
    table: str
    records: int
    undispatched: int
    quarantined: int
    bytes: int
    oldest_undispatched_age_s: float | None


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
        try:
            with self._cursor() as cursor:
                cursor.execute(self.dialect.outbox_insert(self.table, dispatched),
                               [message_id, PERSISTENCE_VERSION, operations])
        except IntegrityError as exc:
            raise OutboxConflict(f"outbox record {message_id} exists: {exc}") from exc

    def store_operations(self, message_id: str, operations: str, dispatched: bool) -> None:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_store_operations(self.table, dispatched), [operations, message_id])

    def claim(self, message_ids: list[str], include_quarantined: bool = False) -> list[tuple[str, str]]:
        """Lock the undispatched records among ``message_ids`` for this transaction, skipping
        records another transaction holds.  Returns [(message_id, operations)]."""
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_claim(self.table, len(message_ids), include_quarantined),
                           list(message_ids))
            rows = cursor.fetchall()
        order = {mid: i for i, mid in enumerate(message_ids)}
        claimed = [(str(mid), ops if isinstance(ops, str) else bytes(ops).decode("utf-8", "replace"))
                   for mid, ops in rows]
        return sorted(claimed, key=lambda r: order.get(r[0], 0))

    def mark_dispatched(self, message_ids: list[str]) -> None:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_mark_dispatched(self.table, len(message_ids)),
                           [EMPTY_OPERATIONS, *message_ids])

    def set_error(self, message_id: str, error: str, quarantine: bool = False) -> None:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.outbox_set_error(self.table, quarantine), [error[:4000], message_id])

    def due(self, grace_seconds: float, limit: int, include_failed: bool = True) -> list[str]:
        """Ids of undispatched, unquarantined records older than ``grace_seconds``, oldest first."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_due(self.table, include_failed), [*d.before_now_params(grace_seconds), limit])
            return [str(row[0]) for row in cursor.fetchall()]

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

    def stats(self) -> OutboxStats:
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.outbox_stats(self.table), [])
            records, undispatched, quarantined, oldest, now = cursor.fetchone()
        age = None
        if oldest is not None:
            age = max((d.to_datetime(now) - d.to_datetime(oldest)).total_seconds(), 0.0)
        return OutboxStats(self.table, int(records), int(undispatched or 0), int(quarantined or 0),
                           self.size(), age)

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


# -- fault injection (tests only) ------------------------------------------------------------


class FaultInjection:
    """TEST-ONLY: SIGKILL this process at named points with a probability.

    Configured by SLUICE_TEST_KILL_AT (``after_commit:0.05,in_handler:0.02``), so tests can
    prove what survives a real process death between the steps of phase 1 and phase 2.
    Empty (the default) makes :meth:`point` a no-op.
    """

    def __init__(self, spec: str = "") -> None:
        self.points: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, probability = part.partition(":")
            if name not in FAULT_POINTS:
                raise ConfigurationError(f"SLUICE_TEST_KILL_AT: unknown point {name!r} (one of {', '.join(FAULT_POINTS)})")
            try:
                self.points[name] = float(probability) if probability else 1.0
            except ValueError:
                raise ConfigurationError(f"SLUICE_TEST_KILL_AT: {part!r} wants point:probability") from None
        self._random = random.Random()

    def point(self, name: str) -> None:
        probability = self.points.get(name)
        if probability and self._random.random() < probability:
            sys.stderr.write(f"sluice fault injection: SIGKILL at {name}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


# -- phase 1 and phase 2 ---------------------------------------------------------------------


@dataclass(frozen=True)
class Phase1Result:
    #: The message had been processed before (or a concurrent copy won): handler skipped.
    duplicate: bool
    #: The record may have operations left to dispatch: run phase 2 after the commit.
    needs_dispatch: bool


@dataclass
class DispatchReport:
    dispatched: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)


class Outbox:
    """Phase 1 and phase 2 on one database alias's outbox table."""

    def __init__(self, using: str | None = None, table: str | None = None,
                 concurrency_control: str | None = None) -> None:
        s = get_settings()
        self.store = OutboxStore(using, table)
        self.using = self.store.using
        self.pessimistic = (concurrency_control or s.OUTBOX_CONCURRENCY_CONTROL) == "pessimistic"
        self.faults = FaultInjection(s.TEST_KILL_AT)

    # -- phase 1: inside the caller's transaction --
    def phase1(self, message_id: str, handler: Callable[[OutboxSender], Any],
               known: dict[str, tuple[bool, bool]] | None = None) -> Phase1Result:
        """De-duplicate, run ``handler(sender)`` and store its operations — in a savepoint of
        the open transaction, so a failure rolls back only this message's work (and
        propagates, for the pump's recoverability).

        ``known``: record states looked up for a whole receive batch at once (see
        :meth:`OutboxStore.states`); updated here with the record this call stores, so a
        second copy in the same batch is recognised too.  Copies committed by others
        after the look-up are still caught by the primary key."""
        sender = OutboxSender(self.using)
        try:
            with transaction.atomic(using=self.using):
                state = known.get(message_id) if known is not None else self.store.state(message_id)
                if state is not None:
                    return Phase1Result(duplicate=True, needs_dispatch=not state[0])
                if self.pessimistic:
                    self.store.insert(message_id, EMPTY_OPERATIONS, dispatched=False)
                handler(sender)
                self.faults.point("in_handler")
                done = not sender.operations
                if self.pessimistic:
                    self.store.store_operations(message_id, sender.encode(), dispatched=done)
                else:
                    self.store.insert(message_id, sender.encode(), dispatched=done)
        except OutboxConflict:
            if known is not None:
                known[message_id] = (False, False)
            # A concurrent copy stored the record first (and committed: its lock made us wait).
            return Phase1Result(duplicate=True, needs_dispatch=True)
        if known is not None:
            known[message_id] = (not sender.operations, False)
        return Phase1Result(duplicate=False, needs_dispatch=bool(sender.operations))

    # -- phase 2: after the commit --
    def after_commit(self, message_ids: list[str]) -> DispatchReport | None:
        """Phase 2 right after phase 1 committed.  Never raises: whatever it cannot finish
        stays undispatched for the background dispatcher."""
        self.faults.point("after_commit")
        try:
            return self.dispatch(message_ids)
        except Exception:
            log.warning("outbox phase 2 for %d record(s) failed; the dispatcher will finish it",
                        len(message_ids), exc_info=True)
            return None

    def dispatch(self, message_ids: Iterable[str], *, include_quarantined: bool = False) -> DispatchReport:
        """Dispatch the operations of undispatched records and mark them dispatched.

        Each chunk is one transaction: claim (locks, skipping records others hold), then per
        record a savepoint around its operations, so one record that cannot be dispatched
        (its destination is gone, another database is down) keeps its LastError and stays
        undispatched without holding the others back.  A record whose operations cannot be
        read is quarantined: kept, shown by ``sluice outbox list``, never dropped."""
        ids = list(dict.fromkeys(message_ids))
        report = DispatchReport()
        for start in range(0, len(ids), DISPATCH_CHUNK):
            self._dispatch_chunk(ids[start:start + DISPATCH_CHUNK], include_quarantined, report)
        return report

    def _dispatch_chunk(self, ids: list[str], include_quarantined: bool, report: DispatchReport) -> None:
        with transaction.atomic(using=self.using):
            local: list[tuple[str, list[dict[str, Any]]]] = []
            remote: list[tuple[str, list[dict[str, Any]]]] = []
            for message_id, text in self.store.claim(ids, include_quarantined):
                try:
                    operations = decode_operations(text)
                except UnreadableOperations as exc:
                    self.store.set_error(message_id, f"quarantined: {exc}", quarantine=True)
                    report.quarantined.append(message_id)
                    log.error("outbox record %s quarantined: %s", message_id, exc)
                    continue
                (local if self._transactional(operations) else remote).append((message_id, operations))
            done: list[str] = []
            # Records whose operations all land in this database: one savepoint for them all;
            # only if that fails, one savepoint each to keep the others going.  Nothing has
            # left the database, so trying again is free of side effects.
            if len(local) > 1:
                try:
                    with transaction.atomic(using=self.using):
                        for _, operations in local:
                            self._dispatch_operations(operations)
                    done += [message_id for message_id, _ in local]
                    local = []
                except Exception:
                    log.info("outbox: a record of %d failed to dispatch; dispatching one by one", len(local))
            for message_id, operations in local + remote:
                if self._dispatch_record(message_id, operations, report):
                    done.append(message_id)
            if done:
                self.faults.point("after_dispatch")
                self.store.mark_dispatched(done)
                report.dispatched.extend(done)

    def _transactional(self, operations: list[dict[str, Any]]) -> bool:
        """True when every operation is an immediate message to a queue in this database."""
        return all(op["kind"] == QUEUE and op.get("using") in (None, self.using) and not op.get("deliver_at")
                   for op in operations)

    def _dispatch_record(self, message_id: str, operations: list[dict[str, Any]], report: DispatchReport) -> bool:
        """Dispatch one record's operations in a savepoint; False (error recorded) on failure."""
        try:
            with transaction.atomic(using=self.using):
                self._dispatch_operations(operations)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.store.set_error(message_id, error)
            report.failed[message_id] = error
            log.warning("outbox record %s not dispatched (will retry): %s", message_id, error)
            return False
        return True

    def _dispatch_operations(self, operations: list[dict[str, Any]]) -> None:
        # Each other database gets one transaction for this record's messages; it commits
        # before the record is marked dispatched (at-least-once for other databases).
        foreign = sorted({op["using"] for op in operations
                          if op["kind"] == QUEUE and op.get("using") and op["using"] != self.using})
        with ExitStack() as stack:
            for alias in foreign:
                if alias not in connections.settings:
                    raise UnknownDestination(f"database alias {alias!r} is not configured")
                stack.enter_context(transaction.atomic(using=alias))
            for op in operations:
                if op["kind"] == QUEUE:
                    self._dispatch_queue(op)
                else:
                    destination(op["kind"]).dispatch(op)

    def _dispatch_queue(self, op: dict[str, Any]) -> None:
        alias = op.get("using") or self.using
        transport = Transport(alias)
        message = outgoing_message(op)
        registry.get(message.queue, alias)  # a queue deleted since the send: a clear UnknownQueue
        if op.get("deliver_at"):
            # Delayed: the transport puts it in the delayed store, due at the instant
            # computed at send time.
            transport.send(message.queue, message.body, message_id=message.message_id, headers=message.headers,
                           correlation_id=message.correlation_id, reply_to=message.reply_to,
                           ttl=message.ttl_seconds, deliver_at=dt.datetime.fromisoformat(op["deliver_at"]))
        else:
            transport.insert(message)

    # -- retention --
    def cleanup(self, keep_seconds: float | None = None, batch_size: int | None = None,
                max_batches: int | None = None) -> int:
        """Delete dispatched records older than the retention, in batches (each its own
        transaction, skipping locked rows).  Undispatched records are never deleted."""
        s = get_settings()
        keep = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR if keep_seconds is None else keep_seconds
        size = batch_size or s.OUTBOX_CLEANUP_BATCH_SIZE
        total = batches = 0
        while max_batches is None or batches < max_batches:
            deleted = self.store.cleanup_batch(keep, size)
            total += deleted
            batches += 1
            if deleted < size:
                break
        if total:
            log.info("outbox clean-up deleted %d record(s) from %s", total, self.store.table)
        return total


# -- the transactional session ----------------------------------------------------------------


class OutboxSession:
    """Messages from code outside a handler (a view, a command, a Celery task) that commit
    with its business writes and are dispatched after the commit::

        with transaction.atomic(), OutboxSession(message_id=f"order-{order.pk}-placed") as session:
            if session.already_processed:   # a retried request: it all happened already
                return
            order.save()
            session.send("billing", {"order": order.pk}, message_type="BillOrder")

    The session is an atomic block itself (a savepoint inside an outer one).  On leaving
    it stores one outbox record holding the messages; dispatch runs on commit, and the
    background dispatcher finishes it if the process dies first.  A stable ``message_id``
    makes a retry safe: the second session with the same id sends nothing —
    ``already_processed`` says so up front, :meth:`send` raises DuplicateMessage, and a
    concurrent twin that got past the check fails at the end with DuplicateMessage, which
    rolls its business writes back too.
    """

    def __init__(self, message_id: str | None = None, *, using: str | None = None,
                 outbox: Outbox | None = None) -> None:
        if message_id is not None and (not isinstance(message_id, str) or not message_id.strip()
                                       or len(message_id) > MAX_MESSAGE_ID_LENGTH
                                       or any(ord(c) < 32 for c in message_id)):
            raise InvalidMessage(f"session message id must be 1–{MAX_MESSAGE_ID_LENGTH} printable characters, "
                                 f"not {message_id!r}")
        self.outbox = outbox or Outbox(using)
        self.using = self.outbox.using
        self.stable = message_id is not None
        self.message_id = message_id or str(uuid.uuid4())
        self.already_processed = False
        self.sender = OutboxSender(self.using)
        self._placeholder = False
        self._atomic: Any = None

    def __enter__(self) -> "OutboxSession":
        self._atomic = transaction.atomic(using=self.using)
        self._atomic.__enter__()
        try:
            if self.stable:
                self.already_processed = self.outbox.store.state(self.message_id) is not None
                if not self.already_processed and self.outbox.pessimistic:
                    try:
                        with transaction.atomic(using=self.using):
                            self.outbox.store.insert(self.message_id, EMPTY_OPERATIONS, dispatched=False)
                        self._placeholder = True
                    except OutboxConflict:
                        self.already_processed = True
        except BaseException as error:
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Send through the outbox (``queue``, ``queue@alias``; ``delay``/``deliver_at``)."""
        self._check()
        return self.sender.send(queue, body, **options)

    def add(self, kind: str, op: dict[str, Any]) -> None:
        """An operation for a registered destination (see workers.outbox for Celery)."""
        self._check()
        self.sender.add(kind, op)

    def _check(self) -> None:
        if self._atomic is None:
            raise ConfigurationError("use OutboxSession as a context manager: `with OutboxSession() as session:`")
        if self.already_processed:
            raise DuplicateMessage(f"session {self.message_id} was processed already; its messages were sent then")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._store()
            except BaseException as error:
                self._atomic.__exit__(type(error), error, error.__traceback__)
                raise
        self._atomic.__exit__(exc_type, exc, tb)

    def _store(self) -> None:
        if self.already_processed:
            return
        has_operations = bool(self.sender.operations)
        if self._placeholder:
            self.outbox.store.store_operations(self.message_id, self.sender.encode(), dispatched=not has_operations)
        elif has_operations or self.stable:
            try:
                self.outbox.store.insert(self.message_id, self.sender.encode(), dispatched=not has_operations)
            except OutboxConflict:
                raise DuplicateMessage(
                    f"session {self.message_id} was processed concurrently; this one rolls back") from None
        if has_operations:
            message_id = self.message_id
            transaction.on_commit(lambda: self.outbox.after_commit([message_id]), using=self.using, robust=True)


def collector_for(target: Any) -> OutboxSession | OutboxSender:
    """What takes outbox operations for ``target``: a session, or a handler context in
    outbox mode (its transport is an OutboxSender)."""
    if isinstance(target, (OutboxSession, OutboxSender)):
        return target
    sender = getattr(target, "transport", None)
    if isinstance(sender, OutboxSender):
        return sender
    raise ConfigurationError(
        "this needs the outbox: pass an OutboxSession, or a handler context of a pump in "
        "SLUICE_TRANSACTION_MODE=outbox"
    )


# -- loops -------------------------------------------------------------------------------------


class OutboxDispatcher:
    """A loop: dispatches records a crash left undispatched (older than the grace period)."""

    def __init__(self, using: str | None = None, *, interval: float | None = None, grace: float | None = None,
                 batch_size: int = DISPATCH_CHUNK, table: str | None = None) -> None:
        s = get_settings()
        self.outbox = Outbox(using, table)
        self.name = f"outbox-dispatcher:{self.outbox.using}"
        self.interval = s.OUTBOX_DISPATCHER_INTERVAL if interval is None else interval
        self.grace = s.OUTBOX_DISPATCHER_GRACE if grace is None else grace
        self.batch_size = batch_size
        self.dispatched = 0

    def step(self) -> float:
        ids = self.outbox.store.due(self.grace, self.batch_size)
        if not ids:
            return self.interval
        report = self.outbox.dispatch(ids)
        self.dispatched += len(report.dispatched)
        if report.dispatched:
            log.info("outbox dispatcher finished %d record(s) left undispatched", len(report.dispatched))
        full = len(ids) == self.batch_size and len(report.dispatched) == len(ids)
        return 0.0 if full else self.interval

    def pending(self) -> bool:
        """Records still waiting for a first dispatch (failed ones and the grace period aside)."""
        return bool(self.outbox.store.due(0, 1, include_failed=False))

    def close(self) -> None:
        pass


class OutboxCleanup:
    """A loop: deletes de-duplication data older than the retention every interval."""

    def __init__(self, using: str | None = None, *, interval: float | None = None,
                 keep_seconds: float | None = None, table: str | None = None) -> None:
        s = get_settings()
        self.outbox = Outbox(using, table)
        self.name = f"outbox-cleanup:{self.outbox.using}"
        self.interval = s.OUTBOX_CLEANUP_INTERVAL if interval is None else interval
        self.keep_seconds = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR if keep_seconds is None else keep_seconds
        self.deleted = 0
        for warning in retention_warnings(s):
            log.warning(warning)

    def step(self) -> float:
        if self.interval <= 0:  # disabled
            return 3600.0
        deleted = self.outbox.cleanup(self.keep_seconds, max_batches=MAX_CLEANUP_BATCHES_PER_STEP)
        self.deleted += deleted
        more = deleted >= MAX_CLEANUP_BATCHES_PER_STEP * get_settings().OUTBOX_CLEANUP_BATCH_SIZE
        return 0.0 if more else self.interval

    def close(self) -> None:
        pass


def worker_loops(using: str | None = None) -> list[OutboxDispatcher | OutboxCleanup]:
    """The outbox loops a worker process hosts: the background dispatcher and the
    clean-up, each unless its interval disables it; none when there is no outbox table."""
    s = get_settings()
    if not OutboxStore(using).exists():
        return []
    loops: list[OutboxDispatcher | OutboxCleanup] = []
    if s.OUTBOX_DISPATCHER_INTERVAL > 0:
        loops.append(OutboxDispatcher(using))
    if s.OUTBOX_CLEANUP_INTERVAL > 0:
        loops.append(OutboxCleanup(using))
    return loops


# -- retention vs retries ------------------------------------------------------------------------


def longest_retry_window(settings=None) -> float:
    """Seconds a message can keep coming back: its delayed retries (the n-th waits
    n × SLUICE_DELAYED_RETRY_INCREASE), plus one peek delay per attempt (a retried message
    waits at the end of its queue).  Delayed-retry settings are read with getattr: they
    come with delayed delivery (SPEC C5: 3 retries at 10, 20 and 30 s)."""
    s = settings or get_settings()
    count = int(getattr(s, "DELAYED_RETRIES", 0) or 0)
    increase = float(getattr(s, "DELAYED_RETRY_INCREASE", 10.0))
    delays = [increase * n for n in range(1, count + 1)]
    attempts = (s.IMMEDIATE_RETRIES + 1) * (count + 1)
    return sum(delays) + attempts * s.PEEK_DELAY


def retention_warnings(settings=None) -> list[str]:
    """Why the retention might let duplicates through (empty when it is long enough)."""
    s = settings or get_settings()
    keep = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR
    window = longest_retry_window(s)
    warnings = []
    if keep < window:
        warnings.append(
            f"SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR is {keep:g} s, shorter than the longest retry window "
            f"({window:g} s of immediate and delayed retries): a copy of a message arriving after its record is "
            "cleaned up would be processed again"
        )
    return warnings
