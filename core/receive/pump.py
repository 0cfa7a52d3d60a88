"""The message pump: per-thread receive loops, chunked processing.

A pump runs ``concurrency`` threads (its ``threads``; core.runtime.loops.ThreadRunner starts
one per unit, each with its own wait).  One :meth:`MessagePump.step` on a thread:

0. A paused queue (core.runtime.pauses: an in-memory set, no statement) is not received from:
   the thread waits for the resume's wake-up.  A limited queue's receive (core.runtime.limits,
   known the same way) first takes a slot and tickets in its transaction (core.receive.permits);
   none free → it takes nothing and the thread waits as the permit says.
1. *Peek* — only when the thread comes back from an idle wait that no wake-up cut
   short: estimate the queue length from max − min RowVersion (never a row count).
   Empty → wait ``peek_delay``.  A wake-up (core.runtime.wakeups: a commit in this process at
   once; another process's through LISTEN/NOTIFY on PostgreSQL; the delayed mover's
   forwards, which go through the same insert path) skips the peek: the thread
   receives at once.
2. *Receive* up to ``receive_batch_size`` rows (capped by ``max_records_to_peek`` and
   by the peek's estimate) in one statement and one transaction, and *process* them:
   in ``sends_atomic_with_receive`` chunk by chunk, one savepoint per chunk — the
   whole batch in one while nothing fails (core.receive.chunks); otherwise one message at a
   time.  A failure is recorded in the same transaction, on the message's row.
3. A full batch → step again at once (and wake an idle thread of the pump: more may
   wait); a short one → wait for a wake-up or the peek delay — unless a wake-up came
   in that found no idle thread: then this one steps again at once.

How the threads are woken, and why no wake-up is lost: core.receive.waking.

Each received message comes to one :class:`~core.outcomes.MessageOutcome`, counted in
one place (:meth:`MessagePump.receive_and_process`).  How a handler runs — in a chunk's
savepoint, on its own, or through the outbox — is the transaction mode's
(core.receive.transaction_modes).  Batch handlers (``@handler(..., batch=True)``) get the
messages of their type in a chunk as one list; when one raises, the chunk runs again
with that list split into one-message calls, which finds the culprit.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.db import DatabaseError, transaction

from core.runtime.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.receive.chunks import ChunkSize, HandlerFailed, Journals, Unit, run_in_savepoints, units
from core.conf import MIN_PEEK_DELAY, get_settings
from core.db import writer_turn
from core.errors import ConfigurationError, NoHandler, PoisonMessage
from core.expiry import on_expired_receive
from core.failures import RETRY_OF, mark_resolved
from core.handlers import HandlerRegistry, as_single, handlers as default_handlers
from core.runtime.loops import current_lane, discard_connection
from core.messages import Message
from core.outcomes import MessageOutcome, PumpStats
from core.runtime.pauses import board
from core.runtime import limits as queue_limits
from core.receive.permits import Permit
from core.queues import dialect, missing_indexes
from core.receive.recoverability import FailureOutcome, Recoverability
from core.tracing.consuming import BatchTrace, batch_trace
from core.receive.transaction_modes import BatchScope, OutboxMode, mode_for
from core.records.writer import NoRecords, RecordBatch, now_us, start_batch
from core.transport import Transport
from core.receive.waking import PumpWaking

log = logging.getLogger("sluice.pump")

PEEK_DELAY_WARNING = 10.0


class MessagePump(PumpWaking):
    """Receives and processes the messages of one queue.  A loop (see core.runtime.loops) run
    by ``threads`` threads at once."""

    def __init__(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        peek_delay: float | None = None,
        max_records_to_peek: int | None = None,
        receive_batch_size: int | None = None,
        transaction_mode: str | None = None,
        immediate_retries: int | None = None,
        delayed_retries: int | None = None,
        handlers: HandlerRegistry | None = None,
        using: str | None = None,
    ) -> None:
        s = get_settings()
        self.queue = queue
        self.name = f"pump:{queue}"
        self.concurrency = concurrency or s.CONCURRENCY
        self.peek_delay = s.PEEK_DELAY if peek_delay is None else peek_delay
        self.max_records_to_peek = max_records_to_peek or s.MAX_RECORDS_TO_PEEK
        self.batch_size = receive_batch_size or s.RECEIVE_BATCH_SIZE
        self.mode = transaction_mode or s.TRANSACTION_MODE
        self.handlers = handlers or default_handlers
        self.business_alias = using or s.DATABASE
        if self.peek_delay < MIN_PEEK_DELAY:
            raise ConfigurationError(f"peek delay below {MIN_PEEK_DELAY * 1000:.0f} ms would put needless load "
                                     "on the database; refused")
        if self.peek_delay > PEEK_DELAY_WARNING:
            log.warning("peek delay of %.1f s on %s: messages may back up", self.peek_delay, queue)
        if self.concurrency < 1 or self.max_records_to_peek < 1 or self.batch_size < 1:
            raise ConfigurationError("concurrency, max_records_to_peek and receive_batch_size must be at least 1")
        if not dialect(self.business_alias).supports_concurrent_writers and self.concurrency > 1:
            # One writer at a time: extra threads would only queue for the write lock.
            log.info("%s allows one writer at a time: pump %s uses 1 thread, not %d",
                     dialect(self.business_alias).vendor, queue, self.concurrency)
            self.concurrency = 1
        #: How many threads run :meth:`step` (core.runtime.loops.ThreadRunner).
        self.threads = self.concurrency
        self.strategy = mode_for(self.mode, self.business_alias)
        self.receive_alias = self.strategy.receive_alias
        self.receiver = Transport(self.receive_alias)
        self.sender = self.strategy.sender
        self.recoverability = Recoverability(self.receiver, immediate_retries, delayed_retries=delayed_retries,
                                             registry=self.handlers)
        self.receive_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"pump-receive:{queue}", s.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        self.processing_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"pump-processing:{queue}", s.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        #: The outbox in outbox mode (operators and tests look at it), else None.
        self.outbox = self.strategy.outbox if isinstance(self.strategy, OutboxMode) else None
        self.stats = PumpStats()
        self._stats_lock = threading.Lock()
        self._stopping = threading.Event()
        self._closed = False
        self.chunk_size = ChunkSize(self.batch_size)
        missing_indexes(queue, self.receive_alias)
        self._start_waking(queue, self.receive_alias, self.threads)
        #: Paused queues as this process knows them (core/runtime/pauses.py): no statement per step.
        self._pauses = board(self.receive_alias)
        #: Limited queues, the same way (core/runtime/limits.py).
        self._limits = queue_limits.board(self.receive_alias)

    # -- the loop -------------------------------------------------------------
    def step(self) -> float:
        """One receive on this thread (module doc): 0 to step again at once, else the
        seconds to wait for a wake-up."""
        lane = self._lanes[current_lane() % len(self._lanes)]
        lane.idle = False
        self._pending = False  # this step begins after any wake-up so far: it sees their rows
        if self._stopping.is_set():
            return self._idle_wait()
        polling = self._listener is None or self._listener.lost.is_set()
        try:
            paused = self._pauses.is_paused(self.queue, polling)
            limits = self._limits.limits(self.queue, polling)
        except DatabaseError as exc:
            discard_connection(self.receive_alias)
            return self.receive_breaker.failure(exc)
        if paused:
            return self._paused(lane)
        want = min(self.batch_size, self.max_records_to_peek)
        if lane.peek:
            try:
                estimate = self.receiver.peek_estimate(self.queue, from_mark=True)
            except DatabaseError as exc:
                discard_connection(self.receive_alias)
                return self.receive_breaker.failure(exc)
            self.receive_breaker.success()
            if estimate == 0:
                # The database answers and nothing waits: a processing breaker armed by an
                # outage closes here too, or an idle queue's would stay armed for ever.
                self.processing_breaker.success()
                return self._short(lane)
            want = min(want, estimate)
        permit = None if limits is None else Permit(limits)
        try:
            got = self.receive_and_process(want, permit)
        except DatabaseError as exc:  # the database, not a handler: handlers' errors are data
            discard_connection(self.receive_alias)
            lane.peek = True
            return self.processing_breaker.failure(exc)
        except Exception:
            discard_connection(self.receive_alias)
            lane.peek = True
            raise
        self.processing_breaker.success()
        if permit is not None:
            if permit.wait:
                return self._held_back(lane, permit.wait)
            want = permit.allowed  # fewer tickets than messages wanted: that many is a full batch
        if got >= want:
            lane.peek = False  # more may wait: straight to the next receive, with a helper
            self._rouse()
            return 0.0
        return self._short(lane)

    def stop(self) -> None:
        """Finish the current batches, take no new ones."""
        self._stopping.set()

    def close(self) -> None:
        """Release the wake-up registrations (each thread's connections are its runner's)."""
        if self._closed:
            return  # (a runner closes its loops; their owner may too)
        self._closed = True
        self._stopping.set()
        self._stop_waking()

    # -- receiving --------------------------------------------------------------
    def receive_and_process(self, limit: int = 1, permit: Permit | None = None) -> int:
        """Receive up to ``limit`` messages in one transaction and process each: chunk by
        chunk (one savepoint per chunk, core.receive.chunks) where the transaction mode allows
        it, else one message at a time.  A limited queue's ``permit`` is taken first and
        spent last, in the same transaction (core.receive.permits)."""
        stats = PumpStats()
        records = start_batch()
        traced: BatchTrace | None = None
        try:
            with writer_turn(self.receive_alias), transaction.atomic(using=self.receive_alias):
                if permit is not None:
                    limit = permit.take(self.receive_alias, limit)
                    if not limit:
                        return 0  # nothing free: the pump waits (permit.wait)
                messages = self.receiver.receive_batch(self.queue, limit)
                batch = self.strategy.batch(messages)
                traced = batch_trace(self.queue, self.mode, len(messages),
                                     self.strategy.work_rolls_back_with_receive) if messages else None
                resolved: dict[str | None, tuple[Any, bool]] = {}  # one registry look-up per type per batch
                if getattr(batch, "chunked", False):
                    outcomes = self._process_chunked(messages, batch, records, resolved, traced)
                else:
                    outcomes = [self._process(message, batch, records, resolved, traced) for message in messages]
                for outcome in outcomes:
                    stats.count(outcome)  # the one place each message's outcome is counted
                records.write(self.receive_alias)  # processing records: one INSERT per batch, this transaction
                if permit is not None:
                    permit.spend(self.receive_alias, len(messages))  # last: the tickets' time is the batch's end
        except BaseException:
            if traced is not None:
                traced.abandon()  # the held spans' work rolled back with the transaction
            raise
        stats.received = len(messages)
        with self._stats_lock:
            self.stats.add(stats)
        try:
            if traced is not None:
                traced.finish(messages, outcomes)  # committed: the held spans end, the metrics count it
        finally:
            batch.after_commit()
        return len(messages)

    def _lookup(self, message: Message, resolved: dict[str | None, tuple[Any, bool]]) -> tuple[Any, bool]:
        key = message.message_type
        found = resolved.get(key)
        if found is None:
            found = resolved[key] = self.handlers.lookup(self.queue, message)
        return found

    def _process_chunked(self, messages: list[Message], batch: Any, records: RecordBatch | NoRecords,
                         resolved: dict[str | None, tuple[Any, bool]],
                         traced: BatchTrace | None) -> list[MessageOutcome]:
        """Chunk by chunk, each chunk as large as :class:`ChunkSize` says (the whole batch
        while nothing fails) and in one savepoint, so that a failure is recorded in this
        transaction without giving the batch back."""
        done: dict[int, MessageOutcome] = {}

        takes_lists = getattr(batch, "takes_lists", True)

        def lookup(message: Message) -> tuple[Any, bool]:
            fn, is_batch = self._lookup(message, resolved)
            if is_batch and not takes_lists:  # each message its own call (the outbox: its own record)
                return as_single(fn), False
            return fn, is_batch

        # What a savepoint rolls back besides the database: the processing records, and the
        # spans of calls whose work went with it.
        journal = records if traced is None else Journals(records, traced)
        start = 0
        while start < len(messages):
            chunk = messages[start:start + self.chunk_size.current]
            failures = run_in_savepoints(units(chunk, lookup), self.receive_alias, batch, journal, done,
                                         run=lambda unit: self._run(unit, batch, records, traced),
                                         fail=lambda message, failed: self._failed(message, failed, records, traced))
            self.chunk_size.after(len(chunk), failures)
            start += len(chunk)
        return [done[id(m)] for m in messages]

    def _process(self, message: Message, batch: BatchScope, records: RecordBatch | NoRecords,
                 resolved: dict[str | None, tuple[Any, bool]], traced: BatchTrace | None) -> MessageOutcome:
        """What one received message comes to, on its own (modes without chunks), inside
        the receive's transaction (and its processing record, written with the batch)."""
        fn, is_batch = (None, False) if message.poison or message.expired else self._lookup(message, resolved)
        if is_batch:
            fn = as_single(fn)
        try:
            return self._run(Unit(fn, [message], False), batch, records, traced)
        except HandlerFailed as failed:
            return self._failed(message, failed, records, traced)

    def _failed(self, message: Message, failed: HandlerFailed, records: RecordBatch | NoRecords,
                traced: BatchTrace | None) -> MessageOutcome:
        try:
            failure = self.recoverability.on_failure(message, failed.cause)
        except BaseException:
            if failed.call is not None:
                failed.call.undecided()
            raise
        # The span first: the record keeps the trace it is in.
        trace_id = traced.failed(message, failed.cause, failure.value, failed.call) if traced is not None else None
        records.handler_failed(message, failure, failed.started_us, trace_id)
        return MessageOutcome.ERRORED if failure is FailureOutcome.ERROR else MessageOutcome.RETRIED

    def _settle(self, message: Message, records: RecordBatch | NoRecords, traced: BatchTrace | None) -> MessageOutcome:
        """A message no handler sees: poison, expired, or no handler for its type."""
        # Each span first: the record keeps the trace it is in.
        if message.poison:
            self.recoverability.move_poison(message)
            trace_id = None if traced is None else traced.settled(
                message, "sluice.moved_to_error_queue", PoisonMessage(message.poison))
            records.to_error_queue(message, trace_id)
            return MessageOutcome.POISON
        if message.expired:
            action = self.recoverability.guarded(message, "the expired message's dead-letter move",
                                                 lambda: on_expired_receive(self.receiver, message)) or "set aside"
            trace_id = None if traced is None else traced.settled(
                message, "sluice.expired", **{"sluice.expiry.action": action})
            records.expired(message, action, trace_id)
            return MessageOutcome.EXPIRED
        missing = NoHandler(f"no handler on {self.queue} for message type {message.message_type!r}")
        self.recoverability.move_to_error(message, missing)
        trace_id = None if traced is None else traced.settled(message, "sluice.moved_to_error_queue", missing)
        records.to_error_queue(message, trace_id)
        return MessageOutcome.ERRORED

    def _run(self, unit: Unit, batch: BatchScope, records: RecordBatch | NoRecords,
             traced: BatchTrace | None) -> MessageOutcome:
        """One handler call (or a settled message); a handler's exception comes out as
        :class:`HandlerFailed` (its failure is recorded by the caller).  Traced, the call's
        process span is current while the handler runs (core.tracing.consuming)."""
        if unit.fn is None:
            return self._settle(unit.messages[0], records, traced)
        debug = log.isEnabledFor(logging.DEBUG)
        started = time.monotonic() if debug else 0.0
        started_us = now_us()
        call = traced.begin(unit.messages) if traced is not None else None
        try:
            if unit.batch:
                outcome = batch.handle_batch(unit.messages, unit.fn)  # type: ignore[attr-defined]
            else:
                outcome = batch.handle(unit.messages[0], unit.fn)
        except Exception as exc:  # the handler's failure is data, not a crash
            if call is not None:
                call.raised(exc)
            raise HandlerFailed(exc, started_us, call) from exc
        except BaseException as exc:  # the thread is stopping: its context must not keep the span
            if call is not None:
                call.abandoned(exc)
            raise
        if call is not None:
            call.done()
        if outcome is MessageOutcome.DUPLICATE:
            if debug:
                log.debug("message %s on %s is a duplicate: handler skipped", unit.messages[0].id, self.queue)
            return outcome
        records.processed_all(unit.messages, started_us, call.trace_id if call is not None else None)
        for message in unit.messages:
            if RETRY_OF in message.headers:  # a retried failed message succeeded: its record is resolved
                mark_resolved(message.headers[RETRY_OF], using=self.receive_alias, queue=message.queue)
        if debug:
            log.debug("handled %d message(s) (%s) on %s in %.1f ms", len(unit.messages),
                      unit.messages[0].message_type, self.queue, (time.monotonic() - started) * 1000)
        return outcome
