"""Chunks: how the pump cuts a receive batch and runs it in savepoints
(``sends_atomic_with_receive``; core.receive.pump.MessagePump.receive_and_process).

A chunk's handler calls run in ONE savepoint, not one per message: on PostgreSQL a
SAVEPOINT and its RELEASE were a third of a no-op drain's time at one per message.  Nor
is it released (core.savepoints.savepoint_to_commit): the commit frees it.  The
price is paid on failure: the calls before the failing one run again.  So a chunk is as
large as the whole batch while nothing fails, and small for a while after something
does (:class:`ChunkSize`).

A chunk's sends are held and inserted together before its savepoint is released
(core.receive.transaction_modes.ChunkedScope).  When the database refuses them (a constraint, a
dropped queue table), nobody can tell from the error whose sends they were: the chunk
rolls back and its messages run again one savepoint each, so that the refusal fails its
own message — retries, then the error queue — and the others commit
(:class:`SendsRefused`).

Every count of a failed attempt is written in the receive's transaction, on the failed
message's row (core.receive.recoverability): any thread or process that takes the row next
continues from the right attempt, and nothing about a failure is kept in memory.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from django.db import connections

from core.messages import Message
from core.outcomes import MessageOutcome
from core.queues import dialect
from core.savepoints import savepoint_to_commit

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

    __slots__ = ("largest", "smallest", "current")

    def __init__(self, batch_size: int) -> None:
        self.largest = batch_size
        self.smallest = min(batch_size, max(MIN_CHUNK_SIZE, -(-batch_size // 16)))
        self.current = batch_size

    def after(self, size: int, failures: int) -> None:
        """A chunk of ``size`` messages ran with ``failures`` failed calls.  (A clean
        chunk doubles the next whatever its own size: a receive of a few messages must
        not shrink the chunks, and after a failure, sparse traffic must grow them back.)"""
        if failures:
            self.current = max(self.smallest, size // 4)
        else:
            self.current = min(self.largest, self.current * 2)


class HandlerFailed(Exception):
    """A handler raised ``cause`` (the pump records it as the message's failure)."""

    def __init__(self, cause: BaseException, started_us: int | None = None, call: Any = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.started_us = started_us  # when its handler started (the processing record's start)
        self.index = -1
        #: The call's open span while tracing (core.tracing.consuming.Call), else None.
        self.call = call


class SendsRefused(Exception):
    """The database refused a chunk's held sends at the flush (``cause``)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class RunAgain(Exception):
    """Raised by a scope's flush: the chunk rolls back and runs again as it is, because
    the scope learns something (``learn``, called once the savepoint is rolled back) that
    makes the next run differ.  The outbox's: a record a concurrent copy of a message
    committed first, after the batch looked its ids up — the copy's handler is skipped
    in the next run.  ``learn`` returns False when it found nothing new: the refusal is
    then treated as any other (:class:`SendsRefused`)."""

    def __init__(self, cause: BaseException, learn: Callable[[], bool]) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.learn = learn


class Unit:
    """What one handler call covers in a chunk: one message, or (a batch handler) the
    chunk's messages of one type.  ``fn`` None: settled without a handler (poison,
    expired, no handler: core.receive.pump.MessagePump._settle)."""

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


class Journals:
    """Several journals (``mark()`` / ``rollback_to(mark)``: the processing records, the
    held spans) that a savepoint marks and rolls back together."""

    def __init__(self, *journals: Any) -> None:
        self.journals = journals

    def mark(self) -> tuple:
        return tuple(journal.mark() for journal in self.journals)

    def rollback_to(self, mark: tuple) -> None:
        for journal, position in zip(self.journals, mark):
            journal.rollback_to(position)


def run_in_savepoints(pending: list[Unit], alias: str, scope: Any, journal: Any,
                      outcomes: dict[int, MessageOutcome], *,
                      run: Callable[[Unit], MessageOutcome],
                      fail: Callable[[Message, HandlerFailed], MessageOutcome]) -> int:
    """Run handler calls in ONE savepoint on ``alias``; put each message's outcome in
    ``outcomes`` (by ``id(message)``) and return how many calls failed.

    When a call raises (``run`` raises :class:`HandlerFailed`), the savepoint rolls back
    with its sends (``scope``) and what ``journal`` kept since it began (processing
    records, held spans: :class:`Journals`).  A batch handler's list is split
    into one-message calls and they run again.  A single message's failure is recorded
    by ``fail`` (in the receive's transaction, outside the savepoint); the calls before
    it run again in a savepoint of their own — their handlers run twice, their database
    work counts once — and the calls after it go on in another.  When the database
    refuses the sends, the calls run again one message per savepoint (:func:`_find_refused`);
    when the scope's flush says :class:`RunAgain`, they run again as they are."""
    failures = 0
    while pending:
        mark = journal.mark()
        try:
            with savepoint_to_commit(alias):
                done = []
                for index, unit in enumerate(pending):
                    try:
                        done.append(run(unit))
                    except HandlerFailed as failed:
                        failed.index = index
                        raise
                _flush(scope)  # the sends, before the chunk ends
        except HandlerFailed as failed:
            failures += 1
            scope.discard()
            journal.rollback_to(mark)
            unit = pending[failed.index]
            if len(unit.messages) > 1:  # which of the batch? One message at a time tells
                log.info("batch handler for %d message(s) failed (%s); calling it per message",
                         len(unit.messages), str(failed.cause))  # text: a record must not keep the traceback
                pending[failed.index:failed.index + 1] = [Unit(unit.fn, [m], True) for m in unit.messages]
                continue
            culprit = unit.messages[0]
            outcomes[id(culprit)] = fail(culprit, failed)
            if failed.index:
                failures += run_in_savepoints(pending[:failed.index], alias, scope, journal, outcomes,
                                              run=run, fail=fail)
            pending = pending[failed.index + 1:]
            continue
        except RunAgain as again:
            scope.discard()
            journal.rollback_to(mark)
            if again.learn():
                continue
            return failures + _find_refused(pending, SendsRefused(again.cause), alias, scope, journal, outcomes,
                                            run=run, fail=fail)
        except SendsRefused as refused:
            scope.discard()
            journal.rollback_to(mark)
            return failures + _find_refused(pending, refused, alias, scope, journal, outcomes, run=run, fail=fail)
        for unit, outcome in zip(pending, done):
            for message in unit.messages:
                outcomes[id(message)] = outcome
        break
    return failures


def _flush(scope: Any) -> None:
    """Insert the held sends; whatever stops them is the database refusing them."""
    try:
        scope.flush()
    except RunAgain:
        raise
    except Exception as exc:
        raise SendsRefused(exc) from exc


def _find_refused(pending: list[Unit], refused: SendsRefused, alias: str, scope: Any, journal: Any,
                  outcomes: dict[int, MessageOutcome], *,
                  run: Callable[[Unit], MessageOutcome],
                  fail: Callable[[Message, HandlerFailed], MessageOutcome]) -> int:
    """The database refused the sends of ``pending``'s savepoint (rolled back by now).  A
    single message's refused sends are its failure, recorded like a handler's; several
    messages run again one savepoint each, which tells whose sends were refused — the
    others commit (their handlers run twice, their database work counts once).  Returns
    how many calls failed, this one included."""
    if connections[alias].needs_rollback:
        raise refused.cause  # the savepoint could not be rolled back: the connection, not a message
    if dialect(alias).is_transient(refused.cause):
        # A deadlock, a lock or statement timeout, a lost connection: the database's state,
        # not a message's sends.  Counted, it would spend a message's retries on an outage;
        # the batch rolls back and is received again, uncounted (issue 34).
        raise refused.cause
    alone = [Unit(unit.fn, [m], unit.batch) for unit in pending for m in unit.messages]
    if len(alone) == 1:
        culprit = alone[0].messages[0]
        log.warning("the database refused the sends of message %s on %s: %s: %s", culprit.id, culprit.queue,
                    type(refused.cause).__name__, str(refused.cause))
        outcomes[id(culprit)] = fail(culprit, HandlerFailed(refused.cause))
        return 1
    log.warning("the database refused the sends of %d message(s) on %s (%s: %s); running them one per "
                "savepoint to find whose", len(alone), alone[0].messages[0].queue,
                type(refused.cause).__name__, str(refused.cause))
    failures = 1
    for unit in alone:
        failures += run_in_savepoints([unit], alias, scope, journal, outcomes, run=run, fail=fail)
    return failures
