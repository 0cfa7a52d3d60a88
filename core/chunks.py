"""Chunks: how the pump cuts a receive batch and runs it in savepoints
(``sends_atomic_with_receive``; core.pump.MessagePump.receive_and_process).

A chunk's handler calls run in ONE savepoint, not one per message: on PostgreSQL a
SAVEPOINT and its RELEASE were a third of a no-op drain's time at one per message.  The
price is paid on failure: the calls before the failing one run again.  So a chunk is as
large as the whole batch while nothing fails, and small for a while after something
does (:class:`ChunkSize`).

While nothing fails, a batch runs *whole* (:func:`run_whole`): in the receive's own
transaction, with no savepoint at all — a SAVEPOINT is a round trip between a delayed
message's receive and its handler's start.  A failure there rolls back the receive
too (:class:`WholeBatchFailed`).  The pump receives again: the failed message's
failure is recorded on its row without calling its handler again, and the rest run
in savepoints.  So a failure costs the same handler calls as in a savepoint (the
ones before it run again), plus one receive; their side effects outside the database
are not undone, as always.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from django.db import DatabaseError, transaction

from core.messages import Message
from core.outcomes import MessageOutcome

log = logging.getLogger("sluice.pump")

#: The smallest chunk a pump falls back to after failures.
MIN_CHUNK_SIZE = 8


class ChunkSize:
    """How many messages the next chunk of a pump takes.  A handler failure costs a
    re-run of the calls before it in its chunk, so after a chunk with failures the next
    ones are a quarter the size (never below :data:`MIN_CHUNK_SIZE`, nor below 1/16 of
    the batch, so a batch takes at most 16 chunks' savepoints plus a few per failure —
    well below the 64 subtransactions PostgreSQL caches per transaction); after each
    clean chunk they double, back up to the whole batch.  One per pump, shared by its
    threads: a lost update between two threads only delays an adjustment by a chunk."""

    __slots__ = ("largest", "smallest", "current", "clean")

    def __init__(self, batch_size: int) -> None:
        self.largest = batch_size
        self.smallest = min(batch_size, max(MIN_CHUNK_SIZE, -(-batch_size // 16)))
        self.current = batch_size
        self.clean = True  # the last chunk had no failure

    def after(self, size: int, failures: int) -> None:
        """A chunk of ``size`` messages ran with ``failures`` failed calls.  (A clean
        chunk doubles the next whatever its own size: a receive of a few messages must
        not shrink the chunks, and after a failure, sparse traffic must grow them back.)"""
        if failures:
            self.current = max(self.smallest, size // 4)
        else:
            self.current = min(self.largest, self.current * 2)
        self.clean = not failures

    @property
    def whole(self) -> bool:
        """Whether the next batch may run whole, without a savepoint (:func:`run_whole`):
        the chunks are back to the whole batch and the last one was clean."""
        return self.clean and self.current >= self.largest


class HandlerFailed(Exception):
    """A handler raised ``cause`` (the pump records it as the message's failure)."""

    def __init__(self, cause: BaseException, started_us: int | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.started_us = started_us  # when its handler started (the processing record's start)
        self.index = -1


class WholeBatchFailed(Exception):
    """A handler failed in a batch run whole: the receive's transaction must roll back
    (raised through it) and the batch be received again, to run in savepoints.
    ``culprit``: the RowVersion of the message that failed, when the call was for one
    message (a batch handler's list does not say which) and the error is not a database
    error — which may be the database's fault (a deadlock victim, a dropped connection),
    not the message's: that handler runs again in a savepoint, which tells them apart as
    the chunked path always does, before an attempt is counted."""

    def __init__(self, failed: HandlerFailed, unit: Unit) -> None:
        super().__init__(str(failed.cause))
        self.failed = failed
        one = len(unit.messages) == 1 and not isinstance(failed.cause, DatabaseError)
        self.culprit = unit.messages[0].row_version if one else None


class Blamed:
    """Handler failures found in batches run whole, by the failed message's RowVersion,
    until a thread of the pump receives that row again and records the failure instead
    of running the handler again.  The pump puts a failure here *before* the whole
    run's rollback frees the row, so whichever of its threads takes the row next sees
    it.  (A row another worker process takes meanwhile runs there again, as after any
    rollback; its entry here goes after ``keep`` newer ones.)"""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self._failures: dict[int, HandlerFailed] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._failures)  # no lock: a hint, checked again in take()

    def put(self, row_version: int, failed: HandlerFailed) -> None:
        with self._lock:
            self._failures[row_version] = failed
            while len(self._failures) > self.keep:
                del self._failures[next(iter(self._failures))]

    def take(self, row_version: int) -> HandlerFailed | None:
        with self._lock:
            return self._failures.pop(row_version, None)


class Unit:
    """What one handler call covers in a chunk: one message, or (a batch handler) the
    chunk's messages of one type.  ``fn`` None: settled without a handler (poison,
    expired, no handler: core.pump.MessagePump._settle)."""

    __slots__ = ("fn", "messages", "batch")

    def __init__(self, fn: Any, messages: list[Message], batch: bool) -> None:
        self.fn = fn
        self.messages = messages
        self.batch = batch


def units(chunk: list[Message], lookup: Callable[[Message], tuple[Any, bool]]) -> list[Unit]:
    """The chunk's handler calls, in order: a batch handler's messages of one type go
    together, at the place of the first of them.  ``lookup`` gives a message's handler
    and whether it takes a list."""
    found: list[Unit] = []
    groups: dict[tuple[int, str | None], Unit] = {}
    for message in chunk:
        fn, is_batch = (None, False) if message.poison or message.expired else lookup(message)
        if not is_batch:
            found.append(Unit(fn, [message], False))
            continue
        key = (id(fn), message.message_type)
        unit = groups.get(key)
        if unit is None:
            unit = groups[key] = Unit(fn, [], True)
            found.append(unit)
        unit.messages.append(message)
    return found


def run_whole(pending: list[Unit], scope: Any, outcomes: dict[int, MessageOutcome], *,
              run: Callable[[Unit], MessageOutcome]) -> None:
    """Run handler calls in the receive's transaction with no savepoint; put each
    message's outcome in ``outcomes`` (by ``id(message)``).  A failing call raises
    :class:`WholeBatchFailed`, to be let through the receive's transaction."""
    for unit in pending:
        try:
            outcome = run(unit)
        except HandlerFailed as failed:
            raise WholeBatchFailed(failed, unit) from failed.cause
        for message in unit.messages:
            outcomes[id(message)] = outcome
    scope.flush()  # the sends, before the receive commits


def run_in_savepoints(pending: list[Unit], alias: str, scope: Any, records: Any,
                      outcomes: dict[int, MessageOutcome], *,
                      run: Callable[[Unit], MessageOutcome],
                      fail: Callable[[Message, HandlerFailed], MessageOutcome]) -> int:
    """Run handler calls in ONE savepoint on ``alias``; put each message's outcome in
    ``outcomes`` (by ``id(message)``) and return how many calls failed.

    When a call raises (``run`` raises :class:`HandlerFailed`), the savepoint rolls back
    with its sends (``scope``) and processing records.  A batch handler's list is split
    into one-message calls and they run again.  A single message's failure is recorded
    by ``fail`` (in the receive's transaction, outside the savepoint); the calls before
    it run again in a savepoint of their own — their handlers run twice, their database
    work counts once — and the calls after it go on in another."""
    failures = 0
    while pending:
        mark = records.mark()
        try:
            with transaction.atomic(using=alias):
                done = []
                for index, unit in enumerate(pending):
                    try:
                        done.append(run(unit))
                    except HandlerFailed as failed:
                        failed.index = index
                        raise
                scope.flush()  # the sends, before the savepoint is released
        except HandlerFailed as failed:
            failures += 1
            scope.discard()
            records.rollback_to(mark)
            unit = pending[failed.index]
            if len(unit.messages) > 1:  # which of the batch? One message at a time tells
                log.info("batch handler for %d message(s) failed (%s); calling it per message",
                         len(unit.messages), failed.cause)
                pending[failed.index:failed.index + 1] = [Unit(unit.fn, [m], True) for m in unit.messages]
                continue
            culprit = unit.messages[0]
            outcomes[id(culprit)] = fail(culprit, failed)
            if failed.index:
                failures += run_in_savepoints(pending[:failed.index], alias, scope, records, outcomes,
                                              run=run, fail=fail)
            pending = pending[failed.index + 1:]
            continue
        for unit, outcome in zip(pending, done):
            for message in unit.messages:
                outcomes[id(message)] = outcome
        break
    return failures
