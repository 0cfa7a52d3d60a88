"""The pump's transaction modes: how a handler runs inside the receive transaction.

One small strategy object per mode (SLUICE_TRANSACTION_MODE), chosen once per pump:

- :class:`SendsAtomicWithReceive` (default): the handler runs in a savepoint of the
  receive's transaction, with a transport on the same connection: receive, business
  writes and sends commit together — exactly-once processing.
- :class:`ReceiveOnly`: the receive runs on a connection of its own; the handler's
  writes and sends autocommit — at-least-once.  Refused where the database allows one
  writer at a time (SQLite).
- :class:`OutboxMode`: as the default, but the handler's sends are stored in the
  outbox record of the incoming message (phase 1) and dispatched after the commit
  (phase 2, core.outbox); a copy of a message processed already skips its handler.

A pump runs several receive batches at once (one per thread), so per-batch state lives
in the :class:`BatchScope` that :meth:`TransactionMode.batch` returns, never in the mode.
Only :class:`ChunkedScope` takes batch handlers' lists (``handle_batch``); the other
modes run a batch handler with one message at a time (core.handlers.as_single).
:class:`ChunkedOutboxScope` runs outbox mode's batches in chunks too, one outbox
record per message.
"""
from __future__ import annotations

import abc
from typing import Any, Protocol, Sequence

from django.db import connections
from django.db.transaction import TransactionManagementError

from core.conf import TRANSACTION_MODES
from core.db import independent_alias
from core.errors import ConfigurationError
from core.handlers import BatchContext, BatchHandler, Handler, HandlerContext
from core.messages import Headers, Message
from core.outbox import Outbox, OutboxConflict, OutboxSender
from core.outcomes import MessageOutcome
from core.queues import dialect
from core.receive.chunks import RunAgain
from core.savepoints import SavepointHeld, innermost_savepoint
from core.transport import OutgoingMessage, Statement, Transport

class BatchScope(Protocol):
    """One receive batch, in one transaction."""

    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        """Run ``fn`` for ``message``: SUCCEEDED, or DUPLICATE when its handler was skipped.
        A handler's exception propagates (after this message's work rolled back)."""

    def after_commit(self) -> None:
        """Work that must follow the batch's commit (the outbox's phase 2)."""


class TransactionMode(abc.ABC):
    """Base: where the receive runs (``receive_alias``) and what a handler sends with."""

    name = ""
    #: Whether a handler's work commits or rolls back with the receive's transaction (and
    #: with a chunk's savepoint); receive_only's handlers write on a connection of their own.
    work_rolls_back_with_receive = True

    def __init__(self, business_alias: str) -> None:
        self.business_alias = business_alias
        self.receive_alias = business_alias
        #: What a handler's context sends with.
        self.sender = Transport(business_alias)

    @abc.abstractmethod
    def batch(self, messages: Sequence[Message]) -> BatchScope:
        """The scope of one receive batch (its messages are already received)."""


class _StatelessMode(TransactionMode):
    """A mode with nothing to remember per batch: it is its own batch scope."""

    def batch(self, messages: Sequence[Message]) -> BatchScope:
        return self

    @abc.abstractmethod
    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        """See :meth:`BatchScope.handle`."""

    def after_commit(self) -> None:
        pass


class SendsAtomicWithReceive(TransactionMode):
    """Handlers run in the receive's transaction; the pump gives each *chunk* of a batch
    one savepoint (:class:`ChunkedScope`), not each message."""

    name = "sends_atomic_with_receive"

    def batch(self, messages: Sequence[Message]) -> BatchScope:
        return ChunkedScope(self.business_alias)


class ChunkBufferedTransport(Transport):
    """A handler's transport inside a chunk: rows it sends are held and inserted by
    :meth:`flush` in one :meth:`Transport.enqueue` (one statement per queue) before the
    chunk ends; :meth:`discard` drops them when the chunk rolls back.
    Rows sent inside a handler's own atomic block that rolled back are dropped at the
    flush, as its writes were (core.savepoints).  Delayed sends go to the store at once
    (inside the savepoint, so they roll back too)."""

    def __init__(self, using: str) -> None:
        super().__init__(using)
        self.pending: SavepointHeld[OutgoingMessage] = SavepointHeld(using)

    def enqueue(self, messages: Sequence[OutgoingMessage], along: Statement | None = None) -> tuple[Any, ...] | None:
        if along is not None:
            # The caller needs along's row now (a task's result row): no buffering; inside
            # the savepoint all the same, so it rolls back with the chunk.
            return Transport.enqueue(self, messages, along)
        self.pending.add(messages)
        return None

    def flush(self) -> None:
        if self.pending:
            held = self.pending.take()
            if held:
                Transport.enqueue(self, held)

    def discard(self) -> None:
        self.pending.clear()


class ChunkedScope:
    """One receive batch in ``sends_atomic_with_receive``: the pump runs it chunk by
    chunk, each chunk in ONE savepoint (core.receive.chunks.run_in_savepoints); a handler
    runs without a savepoint of its own and its sends are buffered per chunk."""

    chunked = True
    #: A batch handler gets the chunk's messages of its type in one call.
    takes_lists = True

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.connection = connections[alias]
        self.dialect = dialect(alias)
        self.sender = ChunkBufferedTransport(alias)

    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        self._begin()
        fn(message, HandlerContext(message, self.sender))
        self._check()
        return MessageOutcome.SUCCEEDED

    def handle_batch(self, messages: list[Message], fn: BatchHandler) -> MessageOutcome:
        """A batch handler's call: ``messages`` of one type from one chunk, as one list."""
        self._begin()
        fn(list(messages), BatchContext(messages, self.sender))
        self._check()
        return MessageOutcome.SUCCEEDED

    def _begin(self) -> None:
        # The chunk's savepoint: sends made directly in it need no savepoint mark.
        self.sender.pending.base = innermost_savepoint(self.connection.savepoint_ids)

    def _check(self) -> None:
        require_usable(self.connection, self.dialect)

    def flush(self) -> None:
        """Before the chunk ends: its handlers' sends, in one go."""
        self.sender.flush()

    def discard(self) -> None:
        """The chunk rolled back: its handlers' sends are gone with it."""
        self.sender.discard()

    def after_commit(self) -> None:
        pass


def require_usable(connection: Any, d: Any) -> None:
    """After a handler ran directly in a chunk's savepoint: a handler that swallowed the
    failure of an ``atomic(savepoint=False)`` block left the chunk marked for rollback
    (Django's semantics); one that caught a database error without an ``atomic()`` of its
    own left PostgreSQL's transaction aborted.  Either is its failure, not the next
    handler's, whose first query would be refused — nor the batch's, whose records' insert
    would be, every time it ran again."""
    if connection.needs_rollback:
        raise TransactionManagementError(
            "the handler returned with its transaction marked for rollback (an "
            "atomic(savepoint=False) block inside it failed): its work cannot commit")
    if d.transaction_aborted(connection.connection):
        raise TransactionManagementError(
            "the handler returned with its transaction aborted by a database error it "
            "caught (wrap the statement that may fail in atomic() to go on after it): its "
            "work cannot commit")


class ReceiveOnly(_StatelessMode):
    name = "receive_only"
    work_rolls_back_with_receive = False

    def __init__(self, business_alias: str) -> None:
        super().__init__(business_alias)
        if not dialect(business_alias).supports_concurrent_writers:
            raise ConfigurationError(
                "receive_only needs a second connection writing while the receive is open; "
                "SQLite allows one writer at a time — use sends_atomic_with_receive"
            )
        self.receive_alias = independent_alias(business_alias)

    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        fn(message, HandlerContext(message, self.sender))
        return MessageOutcome.SUCCEEDED


class OutboxMode(TransactionMode):
    name = "outbox"

    def __init__(self, business_alias: str) -> None:
        super().__init__(business_alias)
        # The outbox lives beside the business data: phase 1 commits with the receive.
        self.outbox = Outbox(business_alias)
        self.outbox.store.require()

    def batch(self, messages: Sequence[Message]) -> BatchScope:
        if self.outbox.pessimistic:
            return _OutboxBatch(self.outbox, messages)
        return ChunkedOutboxScope(self.outbox, messages)


class _OutboxBatch:
    """One receive batch in ``outbox`` mode with pessimistic concurrency control: one
    message at a time, each in its own phase 1 (the record is inserted before the
    handler runs, so a concurrent copy waits on it)."""

    def __init__(self, outbox: Outbox, messages: Sequence[Message]) -> None:
        self.outbox = outbox
        # De-duplication: one look-up for the whole batch.
        self.known = outbox.store.states([message_id_of(m) for m in messages]) if messages else {}
        self.to_dispatch: list[str] = []

    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        message_id = message_id_of(message)
        result = self.outbox.phase1(
            message_id, lambda sender: fn(message, HandlerContext(message, sender)), self.known)
        if result.needs_dispatch:
            self.to_dispatch.append(message_id)
        return MessageOutcome.DUPLICATE if result.duplicate else MessageOutcome.SUCCEEDED

    def after_commit(self) -> None:
        if self.to_dispatch:
            self.outbox.after_commit(self.to_dispatch)  # phase 2; a crash here leaves it to the dispatcher


class ChunkedOutboxScope(_OutboxBatch):
    """One receive batch in ``outbox`` mode (optimistic concurrency control), run chunk
    by chunk as :class:`ChunkedScope` runs one: each chunk in one savepoint, its handlers
    without a savepoint of their own.  Each handler sends into its own
    :class:`~core.outbox.OutboxSender` (so each message's operations stay its own, and a
    batch handler gets one message per call); the chunk's outbox records are inserted
    together before the chunk ends, one statement where a savepoint, an insert and a
    release per message were.

    De-duplication is the per-message phase 1's: the batch's ids are looked up once, a
    record stored earlier in the batch counts, and a concurrent copy that committed its
    record after the look-up makes the flush's insert conflict — the chunk then runs
    again (:class:`~core.receive.chunks.RunAgain`) with that record known, and the copy's
    handler is skipped."""

    chunked = True
    takes_lists = False

    def __init__(self, outbox: Outbox, messages: Sequence[Message]) -> None:
        super().__init__(outbox, messages)
        self.alias = outbox.using
        self.connection = connections[self.alias]
        self.dialect = dialect(self.alias)
        # The open chunk's: records to insert, ids to dispatch, states of its new records.
        self._records: list[tuple[str, str, bool]] = []
        self._dispatch: list[str] = []
        self._stored: dict[str, tuple[bool, bool]] = {}

    def handle(self, message: Message, fn: Handler) -> MessageOutcome:
        message_id = message_id_of(message)
        state = self.known.get(message_id) or self._stored.get(message_id)
        if state is not None:  # processed before (or earlier in this batch): handler skipped
            if not state[0]:
                self._dispatch.append(message_id)
            return MessageOutcome.DUPLICATE
        sender = OutboxSender(self.alias)
        sender.anchor()
        fn(message, HandlerContext(message, sender))
        require_usable(self.connection, self.dialect)
        done = not sender.operations
        self._records.append((message_id, sender.encode(), done))
        self._stored[message_id] = (done, False)
        if not done:
            self._dispatch.append(message_id)
        return MessageOutcome.SUCCEEDED

    def flush(self) -> None:
        """Before the chunk ends: its outbox records, in one go."""
        if self._records:
            try:
                self.outbox.store.insert_many(self._records)
            except OutboxConflict as exc:
                ids = [message_id for message_id, _, _ in self._records]
                raise RunAgain(exc, lambda: self._learn(ids)) from exc
        self.known.update(self._stored)
        self.to_dispatch.extend(self._dispatch)
        self.discard()

    def _learn(self, message_ids: list[str]) -> bool:
        """After a conflict, with the chunk rolled back: which records exist now."""
        found = self.outbox.store.states(message_ids)
        new = {mid: state for mid, state in found.items() if mid not in self.known}
        self.known.update(new)
        return bool(new)

    def discard(self) -> None:
        self._records, self._dispatch, self._stored = [], [], {}


def message_id_of(message: Message) -> str:
    """The id the outbox de-duplicates by: the MessageId header (the row's Id without one)."""
    return message.headers.get(Headers.MESSAGE_ID, message.id)


def mode_for(name: str, business_alias: str) -> TransactionMode:
    """The strategy object for SLUICE_TRANSACTION_MODE ``name``."""
    modes = {cls.name: cls for cls in (SendsAtomicWithReceive, ReceiveOnly, OutboxMode)}
    if name not in modes:
        raise ConfigurationError(f"unknown transaction mode {name!r} (one of {', '.join(TRANSACTION_MODES)})")
    return modes[name](business_alias)
