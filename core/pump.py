"""The message pump: peek, then receive and process up to the concurrency limit.

One step of :class:`MessagePump`:

1. *Peek*: estimate the queue length from max − min RowVersion (never a row count),
   capped by ``max_records_to_peek``.  Empty → wait ``peek_delay``.
2. *Receive*: up to ``concurrency`` threads each take batches of
   ``receive_batch_size`` rows in one transaction until the peeked budget is spent or
   a receive comes back short (someone else got there first) — then back to peek.
3. *Process*: each message runs its handler inside its own savepoint, so one failure
   rolls back only that message's work; the failure is recorded in the same
   transaction (core.recoverability).

Transaction modes:

- ``sends_atomic_with_receive`` (default): receive, the handler's business writes on
  the same database and its sends commit together — exactly-once processing.
- ``receive_only``: the receive runs on a connection of its own; the handler's writes
  and sends are its own business (autocommit): at-least-once.  SQLite allows one
  writer at a time, so this mode is refused there.
- ``outbox``: as ``sends_atomic_with_receive``, but the handler's outgoing messages are
  stored in the outbox record of the incoming message (phase 1, core.outbox) and
  dispatched after the commit (phase 2) — to this database, another one
  (``queue@alias``) or Celery; a copy of a message already processed skips its handler.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from core.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.db import independent_alias, writer_turn
from core.errors import ConfigurationError, NoHandler
from core.expiry import on_expired_receive
from core.handlers import HandlerContext, HandlerRegistry, handlers as default_handlers
from core.messages import Headers, Message
from core.outbox import Outbox
from core.queues import dialect, missing_indexes
from core.recoverability import Recoverability
from core.records.writer import RecordBatch, NoRecords, now_us, start_batch
from core.transport import Transport

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
        if self.peek_delay < 0.1:
            raise ConfigurationError("peek delay below 100 ms would put needless load on the database; refused")
        if self.peek_delay > PEEK_DELAY_WARNING:
            log.warning("peek delay of %.1f s on %s: messages may back up", self.peek_delay, queue)
        if self.concurrency < 1 or self.max_records_to_peek < 1 or self.batch_size < 1:
            raise ConfigurationError("concurrency, max_records_to_peek and receive_batch_size must be at least 1")
        if not dialect(self.business_alias).supports_concurrent_writers and self.concurrency > 1:
            # One writer at a time: extra threads would only queue for the write lock.
            log.info("%s allows one writer at a time: pump %s uses 1 thread, not %d",
                     dialect(self.business_alias).vendor, queue, self.concurrency)
            self.concurrency = 1
        if self.mode == "receive_only":
            if not dialect(self.business_alias).supports_concurrent_writers:
                raise ConfigurationError(
                    "receive_only needs a second connection writing while the receive is open; "
                    "SQLite allows one writer at a time — use sends_atomic_with_receive"
                )
            self.receive_alias = independent_alias(self.business_alias)
        elif self.mode in ("sends_atomic_with_receive", "outbox"):
            self.receive_alias = self.business_alias
        else:
            raise ConfigurationError(f"unknown transaction mode {self.mode!r}")
        self.receiver = Transport(self.receive_alias)
        self.sender = Transport(self.business_alias)
        self.recoverability = Recoverability(self.receiver, immediate_retries, delayed_retries=delayed_retries)
        self.receive_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"pump-receive:{queue}", s.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        self.processing_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"pump-processing:{queue}", s.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        # The outbox lives beside the business data: phase 1 commits with the receive.
        self.outbox: Outbox | None = None
        if self.mode == "outbox":
            self.outbox = Outbox(self.business_alias)
            self.outbox.store.require()
        self.stats = PumpStats()
        self._stats_lock = threading.Lock()
        self._stopping = threading.Event()
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"sluice-{queue}")
        missing_indexes(queue, self.receive_alias)

    # -- the loop -------------------------------------------------------------
    def step(self) -> float:
        try:
            estimate = min(self.receiver.peek_estimate(self.queue), self.max_records_to_peek)
        except DatabaseError as exc:
            self._discard_connection(self.receive_alias)
            return self.receive_breaker.failure(exc)
        self.receive_breaker.success()
        if estimate == 0:
            return self.peek_delay
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
        return 0.0 if received else self.peek_delay

    @staticmethod
    def _discard_connection(alias: str) -> None:
        conn = connections[alias]
        if not conn.in_atomic_block:
            conn.close()

    def stop(self) -> None:
        """Finish the current batches, take no new ones."""
        self._stopping.set()

    def close(self) -> None:
        self._stopping.set()
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
            self._discard_connection(self.receive_alias)
            raise
        return received

    def receive_and_process(self, limit: int = 1) -> int:
        """Receive up to ``limit`` messages in one transaction and process each."""
        stats = PumpStats()
        to_dispatch: list[str] = []
        records = start_batch()
        with writer_turn(self.receive_alias), transaction.atomic(using=self.receive_alias):
            messages = self.receiver.receive_batch(self.queue, limit)
            known = None
            if self.outbox is not None and messages:  # de-duplication: one look-up per batch
                known = self.outbox.store.states([self._message_id(m) for m in messages])
            for message in messages:
                self._process(message, stats, to_dispatch, known, records)
            records.write(self.receive_alias)  # processing records: one INSERT per batch, this transaction
        stats.received = len(messages)
        with self._stats_lock:
            self.stats.add(stats)
        if to_dispatch and self.outbox is not None:
            self.outbox.after_commit(to_dispatch)  # phase 2; a crash here leaves it to the dispatcher
        return len(messages)

    @staticmethod
    def _message_id(message: Message) -> str:
        return message.headers.get(Headers.MESSAGE_ID, message.id)

    def _process(self, message: Message, stats: PumpStats, to_dispatch: list[str],
                 known: dict[str, tuple[bool, bool]] | None = None,
                 records: RecordBatch | NoRecords | None = None) -> None:
        records = records or NoRecords()
        if message.poison:
            self.recoverability.move_poison(message)
            records.to_error_queue(message)
            stats.poison += 1
            return
        if message.expired:
            records.expired(message, on_expired_receive(self.receiver, message))
            stats.expired += 1
            return
        fn = self.handlers.resolve(self.queue, message)
        if fn is None:
            self.recoverability.move_to_error(
                message, NoHandler(f"no handler on {self.queue} for message type {message.message_type!r}"))
            records.to_error_queue(message)
            stats.errored += 1
            return
        context = HandlerContext(message=message, transport=self.sender)
        started = time.monotonic()
        started_us = now_us()
        try:
            if self.outbox is not None:
                message_id = self._message_id(message)
                result = self.outbox.phase1(
                    message_id, lambda sender: fn(message, HandlerContext(message=message, transport=sender)), known)
                if result.needs_dispatch:
                    to_dispatch.append(message_id)
                if result.duplicate:
                    stats.duplicates += 1
                    log.debug("message %s on %s is a duplicate: handler skipped", message_id, self.queue)
                    return
            elif self.mode == "sends_atomic_with_receive":
                with transaction.atomic(using=self.business_alias):  # a savepoint
                    fn(message, context)
            else:
                fn(message, context)
        except Exception as exc:  # the handler's failure is data, not a crash
            outcome = self.recoverability.on_failure(message, exc)
            records.handler_failed(message, outcome, started_us)
            if outcome == "error":
                stats.errored += 1
            else:
                stats.retried += 1
            return
        records.processed(message, started_us)
        stats.succeeded += 1
        if "Sluice.RetryOf" in message.headers:  # a retried failed message succeeded (core.failures.RETRY_OF)
            from core.failures import mark_resolved
            mark_resolved(message.headers["Sluice.RetryOf"], using=self.receive_alias)
        log.debug("handled %s (%s) on %s in %.1f ms", message.id, message.message_type, self.queue,
                  (time.monotonic() - started) * 1000)
