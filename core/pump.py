"""The message pump: peek, then receive and process up to the concurrency limit.

One step of :class:`MessagePump`:

1. *Peek*: estimate the queue length from max − min RowVersion (never a row count),
   capped by ``max_records_to_peek``.  Empty → wait ``peek_delay``, or until a send
   wakes the pump (core.wakeups: a commit in this process at once; another process's
   through LISTEN/NOTIFY on PostgreSQL; the delayed mover's forwards too, as they go
   through the same insert path).
2. *Receive*: up to ``concurrency`` threads each take batches of
   ``receive_batch_size`` rows in one transaction until the peeked budget is spent or
   a receive comes back short (someone else got there first) — then back to peek.
3. *Process*: each message runs its handler inside its own savepoint, so one failure
   rolls back only that message's work; the failure is recorded in the same
   transaction (core.recoverability).

Each received message comes to one :class:`~core.outcomes.MessageOutcome`, decided in
:meth:`MessagePump._process` and counted in one place (:meth:`receive_and_process`).
How a handler runs — in a savepoint, on its own, or through the outbox — is the
transaction mode's (core.transaction_modes, one strategy object per mode).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from django.db import DatabaseError, connections, transaction

from core.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import MIN_PEEK_DELAY, get_settings
from core.db import writer_turn
from core.errors import ConfigurationError, NoHandler
from core.expiry import on_expired_receive
from core.failures import RETRY_OF, mark_resolved
from core.handlers import HandlerRegistry, handlers as default_handlers
from core.loops import discard_connection
from core.messages import Message
from core.outcomes import MessageOutcome
from core.queues import dialect, missing_indexes
from core.recoverability import FailureOutcome, Recoverability
from core.transaction_modes import BatchScope, OutboxMode, mode_for
from core.records.writer import NoRecords, RecordBatch, now_us, start_batch
from core.transport import Transport
from core.wakeups import PostgresListener, acquire_listener, queue_key, release_listener, wake_hub

log = logging.getLogger("sluice.pump")

PEEK_DELAY_WARNING = 10.0


@dataclass
class PumpStats:
    received: int = 0
    succeeded: int = 0
    retried: int = 0
    errored: int = 0
    expired: int = 0
    poison: int = 0
    #: Copies of already processed messages absorbed by the outbox (handler skipped).
    duplicates: int = 0

    def add(self, other: "PumpStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def count(self, outcome: MessageOutcome) -> None:
        setattr(self, outcome.value, getattr(self, outcome.value) + 1)


#: Messages per savepoint in a receive batch (sends_atomic_with_receive): a batch of
#: SLUICE_RECEIVE_BATCH_SIZE rows takes batch/CHUNK_SIZE savepoints plus one per handler
#: failure — far below the 64 subtransactions PostgreSQL caches per transaction.
CHUNK_SIZE = 32


class _HandlerFailed(Exception):
    """A handler raised ``cause`` (the pump records it as the message's failure)."""

    def __init__(self, cause: BaseException, started_us: int | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.started_us = started_us  # when its handler started (the processing record's start)
        self.index = -1


class _Budget:
    """How many more messages this peek cycle may receive (shared by the threads)."""

    def __init__(self, total: int) -> None:
        self._left = total
        self._lock = threading.Lock()

    def take(self, want: int) -> int:
        with self._lock:
            got = min(want, self._left)
            self._left -= got
            return got


class MessagePump:
    """Receives and processes the messages of one queue.  A loop (see core.loops)."""

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
        self.strategy = mode_for(self.mode, self.business_alias)
        self.receive_alias = self.strategy.receive_alias
        self.receiver = Transport(self.receive_alias)
        self.sender = self.strategy.sender
        self.recoverability = Recoverability(self.receiver, immediate_retries, delayed_retries=delayed_retries)
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
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"sluice-{queue}")
        missing_indexes(queue, self.receive_alias)
        self._wake: Callable[[], None] = lambda: None
        self._hub_handle = wake_hub.register(queue_key(queue), self._on_wake)
        receive_dialect = dialect(self.receive_alias)
        self._poll_while_lost = receive_dialect.wake_poll_interval
        self._listener: PostgresListener | None = \
            acquire_listener(self.receive_alias) if receive_dialect.supports_notify else None

    # -- waking ---------------------------------------------------------------------
    def bind_wake(self, wake: Callable[[], None]) -> None:
        """The runner's way to cut this loop's wait short."""
        self._wake = wake

    def _on_wake(self, _due_epoch: float = 0.0) -> None:
        self._wake()

    def _idle_wait(self) -> float:
        """How long an empty queue waits: the peek delay, but no longer than the dialect's
        poll while the LISTEN connection is lost (a NOTIFY sent then is never heard)."""
        if self._listener is not None and self._listener.lost.is_set():
            return min(self.peek_delay, self._poll_while_lost)
        return self.peek_delay

    # -- the loop -------------------------------------------------------------
    def step(self) -> float:
        try:
            estimate = min(self.receiver.peek_estimate(self.queue), self.max_records_to_peek)
        except DatabaseError as exc:
            discard_connection(self.receive_alias)
            return self.receive_breaker.failure(exc)
        self.receive_breaker.success()
        if estimate == 0:
            return self._idle_wait()
        budget = _Budget(estimate)
        workers = min(self.concurrency, math.ceil(estimate / self.batch_size))
        futures = [self._executor.submit(self._receive_until_short, budget) for _ in range(workers)]
        received, failure = 0, None
        for future in futures:
            try:
                received += future.result()
            except DatabaseError as exc:  # the database, not a handler: handlers' errors are data
                failure = exc
        if failure is not None:
            return self.processing_breaker.failure(failure)
        self.processing_breaker.success()
        return 0.0 if received else self._idle_wait()

    def stop(self) -> None:
        """Finish the current batches, take no new ones."""
        self._stopping.set()

    def close(self) -> None:
        if self._closed:
            return  # (a runner closes its loops; their owner may too)
        self._closed = True
        self._stopping.set()
        wake_hub.unregister(self._hub_handle)
        if self._listener is not None:
            release_listener(self.receive_alias, self._listener)
            self._listener = None
        # One close per pool thread: the barrier keeps each task on its own thread.
        barrier = threading.Barrier(self.concurrency)

        def close_connections() -> None:
            connections.close_all()
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                pass

        for _ in range(self.concurrency):
            self._executor.submit(close_connections)
        self._executor.shutdown(wait=True)

    # -- receiving --------------------------------------------------------------
    def _receive_until_short(self, budget: _Budget) -> int:
        received = 0
        try:
            while not self._stopping.is_set():
                want = budget.take(self.batch_size)
                if not want:
                    break
                got = self.receive_and_process(want)
                received += got
                if got < want:
                    break  # another receiver got there first, or the queue is empty: peek again
        except Exception:
            discard_connection(self.receive_alias)
            raise
        return received

    def receive_and_process(self, limit: int = 1) -> int:
        """Receive up to ``limit`` messages in one transaction and process each: chunk by
        chunk (one savepoint per chunk) where the transaction mode allows it, else one
        message at a time."""
        stats = PumpStats()
        records = start_batch()
        with writer_turn(self.receive_alias), transaction.atomic(using=self.receive_alias):
            messages = self.receiver.receive_batch(self.queue, limit)
            batch = self.strategy.batch(messages)
            if getattr(batch, "chunked", False):
                outcomes = [outcome for start in range(0, len(messages), CHUNK_SIZE)
                            for outcome in self._process_chunk(messages[start:start + CHUNK_SIZE], batch, records)]
            else:
                outcomes = [self._process(message, batch, records) for message in messages]
            for outcome in outcomes:
                stats.count(outcome)  # the one place each message's outcome is counted
            records.write(self.receive_alias)  # processing records: one INSERT per batch, this transaction
        stats.received = len(messages)
        with self._stats_lock:
            self.stats.add(stats)
        batch.after_commit()
        return len(messages)

    def _process_chunk(self, chunk: list[Message], batch: Any,
                       records: RecordBatch | NoRecords) -> list[MessageOutcome]:
        """Run a chunk in ONE savepoint.  When a handler raises, the savepoint rolls back,
        that message's failure is recorded (in the receive's transaction, outside the
        savepoint) and the chunk runs again without it — its earlier messages included:
        their handlers run twice, their database work (and processing records) counts once.
        Outcomes in order."""
        outcomes: dict[int, MessageOutcome] = {}
        pending = list(chunk)
        while pending:
            mark = records.mark()  # the chunk's processing records go if its savepoint does
            try:
                with transaction.atomic(using=self.receive_alias):  # the chunk's savepoint
                    done = []
                    for index, message in enumerate(pending):
                        try:
                            done.append(self._run(message, batch, records))
                        except _HandlerFailed as failed:
                            failed.index = index
                            raise
                    batch.flush()  # the chunk's sends, before its savepoint is released
            except _HandlerFailed as failed:
                batch.discard()
                records.rollback_to(mark)
                culprit = pending.pop(failed.index)
                outcomes[id(culprit)] = self._failed(culprit, failed, records)
                continue
            outcomes.update((id(m), outcome) for m, outcome in zip(pending, done))
            break
        return [outcomes[id(m)] for m in chunk]

    def _process(self, message: Message, batch: BatchScope, records: RecordBatch | NoRecords) -> MessageOutcome:
        """What one received message comes to, inside the receive's transaction (and its
        processing record, written with the batch)."""
        try:
            return self._run(message, batch, records)
        except _HandlerFailed as failed:
            return self._failed(message, failed, records)

    def _failed(self, message: Message, failed: "_HandlerFailed", records: RecordBatch | NoRecords) -> MessageOutcome:
        failure = self.recoverability.on_failure(message, failed.cause)
        records.handler_failed(message, failure, failed.started_us)
        return MessageOutcome.ERRORED if failure is FailureOutcome.ERROR else MessageOutcome.RETRIED

    def _run(self, message: Message, batch: BatchScope, records: RecordBatch | NoRecords) -> MessageOutcome:
        """:meth:`_process` up to the handler; a handler's exception comes out as
        :class:`_HandlerFailed` (its failure is recorded by the caller)."""
        if message.poison:
            self.recoverability.move_poison(message)
            records.to_error_queue(message)
            return MessageOutcome.POISON
        if message.expired:
            records.expired(message, on_expired_receive(self.receiver, message))
            return MessageOutcome.EXPIRED
        fn = self.handlers.resolve(self.queue, message)
        if fn is None:
            self.recoverability.move_to_error(
                message, NoHandler(f"no handler on {self.queue} for message type {message.message_type!r}"))
            records.to_error_queue(message)
            return MessageOutcome.ERRORED
        started = time.monotonic()
        started_us = now_us()
        try:
            outcome = batch.handle(message, fn)
        except Exception as exc:  # the handler's failure is data, not a crash
            raise _HandlerFailed(exc, started_us) from exc
        if outcome is MessageOutcome.DUPLICATE:
            log.debug("message %s on %s is a duplicate: handler skipped", message.id, self.queue)
            return outcome
        records.processed(message, started_us)
        if RETRY_OF in message.headers:  # a retried failed message succeeded: its record is resolved
            mark_resolved(message.headers[RETRY_OF], using=self.receive_alias)
        log.debug("handled %s (%s) on %s in %.1f ms", message.id, message.message_type, self.queue,
                  (time.monotonic() - started) * 1000)
        return outcome
