"""The mover: a loop that forwards due delayed messages to their queues.

Take up to ``batch_size`` due messages out of the store (one ``DELETE … RETURNING``
where the store can: ``claim``) → put each in its queue, all in
one transaction when the store and the queues share a database (exactly once), and
again at once while messages are due.  On PostgreSQL the claim also says when the next
message left is due, so a step that moved a few asks nothing after its commit.  A store elsewhere (another database, a store of
your own) is cleared only after the queue insert committed: a crash between the two
commits forwards a message twice, never loses it (at least once).  When nothing is due it sleeps until the next
due time (at most ``max_sleep``) or until a store anywhere makes an earlier message
due: PostgreSQL ``LISTEN/NOTIFY`` across processes (polling while the listener is
down), an in-process hub otherwise, and a short poll where the database cannot
notify (SQLite, SQL Server).

Several workers *elect one mover* through a lease row (core.runtime.lease) rather than all
polling — every due instant would otherwise wake every worker to race for the same
rows.  The fetch still locks rows and skips locked ones, so even two movers
overlapping during a lease hand-over never deliver a message twice.

Failures: the database's (connection lost, deadlock, lock timeout, serialization
failure — the dialect's ``is_transient``) roll the batch back and count toward the
fetch / dispatch breakers; only a message's own fault (unknown queue, unreadable
headers, …) counts toward its ``RetryCount`` and, past ``number_of_retries``, sends it
to the error queue.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import time
from typing import Any, Callable

from django.db import DatabaseError, connections, transaction

from core.runtime.breakers import FailureRateCircuitBreaker, RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.db import writer_turn
from core.delayed.clearing import StoreClearing
from core.delayed.listener import PostgresListener, acquire_listener, release_listener
from core.delayed.sql_store import DueClaim, SqlDelayedStore
from core.delayed.wake import NOTIFY_CHANNEL, wake_hub
from core.errors import InvalidMessage
from core.runtime.lease import Lease
from core.messages import Headers, failure_headers, wire_time
from core.scheduling import DelayedMessage, DelayedMessageStore, delayed_store
from core.tracing import producing as tracing
from core.transport import OutgoingMessage, Transport

log = logging.getLogger("sluice.delayed")


class _Phase(Exception):
    """A database failure, and the phase — so the breaker — it belongs to."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _FetchFailed(_Phase):
    """Reading the store (or the lease) failed: the fetch breaker."""


class _DispatchFailed(_Phase):
    """Putting messages in their queues failed: the dispatch breaker."""


class DelayedMover:
    """A loop that forwards due delayed messages to their queues (see the module doc)."""

    def __init__(
        self,
        store: DelayedMessageStore | None = None,
        *,
        using: str | None = None,
        batch_size: int | None = None,
        max_sleep: float | None = None,
        number_of_retries: int | None = None,
        error_queue: str | None = None,
        lease_seconds: float | None = None,
        elect: bool = True,
    ) -> None:
        s = get_settings()
        self.using = using or s.DATABASE
        self.store = store or delayed_store(self.using)
        self.table = getattr(self.store, "table", type(self.store).__name__)
        self.name = f"delayed-mover:{self.table}"
        self.batch_size = batch_size or s.DELAYED_BATCH_SIZE
        self.max_sleep = max_sleep or s.DELAYED_MAX_SLEEP
        self.number_of_retries = s.DELAYED_NUMBER_OF_RETRIES if number_of_retries is None else number_of_retries
        self.error_queue = error_queue or s.ERROR_QUEUE
        self.transport = Transport(self.using, delayed=self.store)
        # Exactly once where the store shares the mover's transaction, else at least once
        # (core.delayed.clearing).  The claim deletes as it reads: only inside that shared
        # transaction may it run before the queue insert that could fail.
        self.clearing = StoreClearing(self.store, self.using)
        self._claim: Callable[[int], DueClaim] | None = getattr(self.store, "claim", None) \
            if self.clearing.shares_transaction else None
        #: What this step's committed claim said of the store: (next due, the database's
        #: now, this process's monotonic clock then); None: ask after the commit.
        self._seen_next: tuple[dt.datetime | None, dt.datetime, float] | None = None
        self.lease = Lease(f"delayed-mover:{self.table}", lease_seconds or s.MOVER_LEASE_SECONDS, self.using) \
            if elect else None
        self.fetch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"delayed-fetch:{self.table}", s.TIME_TO_TRIGGER_FETCH_BREAKER)
        self.dispatch_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"delayed-dispatch:{self.table}", s.TIME_TO_TRIGGER_DISPATCH_BREAKER)
        self.recovery_breaker = FailureRateCircuitBreaker(
            f"delayed-recovery:{self.table}", s.MAXIMUM_RECOVERY_FAILURES_PER_SECOND)
        self.moved = 0
        self.failed = 0
        self._recovery_pause = 0.0
        self._sleep_until = 0.0  # wall-clock epoch the current wait ends
        self._wake: Callable[[], None] = lambda: None
        self._hub_key = wake_hub.register(self.table, self._on_store)
        self._listener: PostgresListener | None = None
        # How often to look for messages stored by other processes that cannot wake us.
        self._poll: float | None = 1.0
        if isinstance(self.store, SqlDelayedStore):
            self._poll = self.store.dialect.wake_poll_interval
            if self.store.dialect.supports_notify:
                self._poll = None
                self._listener = acquire_listener(self.using)

    # -- waking ---------------------------------------------------------------------
    def bind_wake(self, wake: Callable[[], None]) -> None:
        """The runner's way to cut this loop's wait short."""
        self._wake = wake

    def _on_store(self, due_epoch: float) -> None:
        if due_epoch < self._sleep_until:
            self._wake()

    # -- the loop -----------------------------------------------------------------------
    def step(self) -> float:
        # Until this step decides how long to sleep, any store must wake us: one that
        # commits after our "next due" query would otherwise be slept through.
        self._sleep_until = math.inf
        try:
            if self.lease is not None and not self._guard(self.lease.acquire):
                return self._sleep(self.lease.follower_wait())
            moved = self.move_due()
        except _Phase as failure:
            breaker = self.fetch_breaker if isinstance(failure, _FetchFailed) else self.dispatch_breaker
            return self._sleep(breaker.failure(failure.cause))
        self.fetch_breaker.success()
        self.dispatch_breaker.success()
        self.recovery_breaker.success()
        pause, self._recovery_pause = self._recovery_pause, 0.0
        if pause:
            return self._sleep(pause)
        if moved >= self.batch_size:
            return 0.0
        try:
            nxt, now = self._guard(self._next_and_now)
        except _Phase as failure:
            return self._sleep(self.fetch_breaker.failure(failure.cause))
        wait = self.max_sleep if nxt is None else min(max((nxt - now).total_seconds(), 0.0), self.max_sleep)
        poll = self._poll_interval()
        if poll is not None:
            wait = min(wait, poll)
        if self.lease is not None:
            wait = min(wait, self.lease.renew_every)
        return self._sleep(wait)

    def _poll_interval(self) -> float | None:
        """How often to look for messages stored by processes that cannot wake us: never
        while the LISTEN connection is up; the dialect's poll while it is down (a
        notification sent then is lost)."""
        if self._listener is not None and not self._listener.connected.is_set():
            return self.store.dialect.wake_poll_interval
        return self._poll

    def _sleep(self, seconds: float) -> float:
        self._sleep_until = time.time() + seconds
        return seconds

    def _next_and_now(self) -> tuple[dt.datetime | None, dt.datetime]:
        seen, self._seen_next = self._seen_next, None
        if seen is not None:
            # Said by this step's claim: its now, moved on by the time the step took since.
            nxt, now, at = seen
            return nxt, now + dt.timedelta(seconds=time.monotonic() - at)
        if isinstance(self.store, SqlDelayedStore):
            return self.store.next_and_now()
        return self.store.next(), dt.datetime.now(dt.timezone.utc)

    @staticmethod
    def _guard(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except DatabaseError as exc:
            raise _FetchFailed(exc) from exc

    def close(self) -> None:
        wake_hub.unregister(self._hub_key)
        if self._listener is not None:
            release_listener(self.using, self._listener)
        if self.lease is not None:
            try:
                held = self.lease.held
                self.lease.release()
                if held:
                    self._wake_standbys()
            except DatabaseError:
                pass

    def _wake_standbys(self) -> None:
        """The lease is free: tell other movers now rather than at their next lease check."""
        if isinstance(self.store, SqlDelayedStore) and self.store.dialect.supports_notify:
            with connections[self.using].cursor() as cursor:
                cursor.execute(self.store.dialect.notify(), [NOTIFY_CHANNEL, "*|0"])

    # -- moving -------------------------------------------------------------------------
    def move_due(self) -> int:
        """Move one batch of due messages.  First all in one go; if a message in it fails,
        the batch rolls back and is moved again one savepoint per message, so one bad
        message neither blocks nor duplicates the others.  A failure of the database
        itself (lost connection, deadlock, lock timeout: :meth:`_database_fault`) rolls
        the batch back for the next step and goes to the breakers, not to a message."""
        try:
            return self._move_batch(isolate=False)
        except _Phase as failure:
            if isinstance(failure, _FetchFailed) or self._database_fault(failure.cause):
                raise
            log.info("batch move failed (%s); moving message by message", failure.cause)
        except DatabaseError as exc:
            if self._database_fault(exc):
                raise self._lost_or_dispatch(exc) from exc
            log.info("batch move failed (%s); moving message by message", exc)
        except Exception as exc:  # noqa: BLE001 — a message-level failure: isolate it
            log.info("batch move failed (%s); moving message by message", exc)
        try:
            return self._move_batch(isolate=True)
        except _Phase:
            raise
        except DatabaseError as exc:  # per-message errors are handled inside
            raise self._lost_or_dispatch(exc) from exc

    def _lost_or_dispatch(self, exc: BaseException) -> _Phase:
        """A lost connection is the fetch breaker's (nothing works); otherwise dispatch's."""
        return _DispatchFailed(exc) if self._connection_usable() else _FetchFailed(exc)

    def _database_fault(self, exc: BaseException) -> bool:
        """The database's fault, not the message's: the connection is gone, or the error
        is one the dialect calls transient (deadlock, lock timeout, serialization)."""
        if not self._connection_usable():
            return True
        return isinstance(exc, DatabaseError) and self.transport.dialect.is_transient(exc)

    def _connection_usable(self) -> bool:
        conn = connections[self.using]
        return conn.connection is not None and conn.is_usable()

    def _move_batch(self, isolate: bool) -> int:
        claim_due = None if isolate else self._claim
        self._seen_next = None
        seen = None
        queued = False
        try:
            with self.clearing.store_transaction():
                with writer_turn(self.using), transaction.atomic(using=self.using):
                    if claim_due is not None:
                        # Out of the store already (its rows come back if this transaction rolls back).
                        claim = self._guard(lambda: claim_due(self.batch_size))
                        batch = claim.messages
                        if claim.now is not None:
                            seen = (claim.next_due, claim.now, time.monotonic())
                        if batch:
                            self._forward_all(batch, removed=True)
                    else:
                        batch = self._fetch_batch()
                        if isolate:
                            for message in batch:
                                self._forward_one(message)
                        elif batch:
                            self._forward_all(batch, removed=False)
                queued = True
                self.clearing.queue_committed()
        except DatabaseError as exc:
            if not queued:
                raise
            # Forwarded but still stored: the store's fault, not the messages' (moving them
            # one by one now would forward them again at once).  Forwarded again later.
            log.warning("%d delayed message(s) were forwarded but could not be removed from %s (%s); "
                        "they will be forwarded again", len(self.clearing.pending), self.table, exc)
            raise _FetchFailed(exc) from exc
        self._seen_next = seen  # only a committed claim's answer holds
        if batch:
            log.debug("moved %d delayed message(s) from %s", len(batch), self.table)
        return len(batch)

    def _fetch_batch(self) -> list[DelayedMessage]:
        fetch_due = getattr(self.store, "fetch_due", None)
        if fetch_due is not None:
            return self._guard(lambda: fetch_due(self.batch_size))
        # A store with only the interface: one at a time (it locks what it hands out).
        now = dt.datetime.now(dt.timezone.utc)
        batch: list[DelayedMessage] = []
        while len(batch) < self.batch_size:
            message = self._guard(lambda: self.store.fetch_next_due(now))
            if message is None:
                break
            batch.append(message)
        return batch

    def _forward_one(self, message: DelayedMessage) -> None:
        """Forward in a savepoint; a failure is counted, or sends it to the error queue."""
        try:
            with transaction.atomic(using=self.using):
                self._forward(message)
        except _Phase as failure:
            if self._database_fault(failure.cause):
                raise
            self._forward_failed(message, failure.cause)
        except Exception as exc:  # noqa: BLE001 — recorded per message below
            self._forward_failed(message, exc)

    def _outgoing(self, message: DelayedMessage, delivered_at: str) -> OutgoingMessage:
        """The queue row for a due message; its TTL starts now, when it lands."""
        if message.extra.get("poison"):
            raise InvalidMessage(f"stored headers cannot be read: {message.extra['poison']}")
        headers = {**message.headers, Headers.DELIVERED_AT: delivered_at}
        return self.transport.outgoing(message.destination, _message_id(message), headers, message.body)

    def _forward_all(self, batch: list[DelayedMessage], removed: bool) -> None:
        """The fast path: the whole batch in a constant number of statements (one insert
        per destination queue, and one delete unless the batch was claimed: already
        ``removed``).  Any failure sends the caller to the per-message path."""
        delivered_at = wire_time(dt.datetime.now(dt.timezone.utc))
        outgoing = [self._outgoing(m, delivered_at) for m in batch]
        with tracing.forward_span(self.table, (m.headers for m in batch)):
            try:
                self.transport.enqueue(outgoing)
                if not removed:
                    self.clearing.forwarded(batch)
            except DatabaseError as exc:
                raise _DispatchFailed(exc) from exc
        self.moved += len(batch)

    def _forward(self, message: DelayedMessage) -> None:
        """Put one message in its queue and take it out of the store."""
        try:
            outgoing = self._outgoing(message, wire_time(dt.datetime.now(dt.timezone.utc)))
        except DatabaseError as exc:
            raise _DispatchFailed(exc) from exc
        with tracing.forward_span(self.table, (message.headers,)):
            try:
                self.transport.enqueue([outgoing])
                self.clearing.forwarded([message])
            except DatabaseError as exc:
                raise _DispatchFailed(exc) from exc
        self.moved += 1

    def _forward_failed(self, message: DelayedMessage, exc: BaseException) -> None:
        """``number_of_retries`` failed forwards are retried; the next one goes to the error
        queue.  So a message is forwarded at most number_of_retries + 1 times."""
        self.failed += 1
        pause = self.recovery_breaker.failure(exc)
        failures = message.retry_count + 1
        if failures <= self.number_of_retries or not self._move_to_error(message, exc, failures):
            self.store.increment_failure_count(message)
            log.warning("forwarding delayed message %s to %s failed (%d of %d): %s", message.id,
                        message.destination, failures, self.number_of_retries + 1, exc)
        # Never sleep here: this runs inside the batch's transaction, holding row locks.
        self._recovery_pause = max(self._recovery_pause, pause)

    def _move_to_error(self, message: DelayedMessage, exc: BaseException, failures: int) -> bool:
        """Into the error queue, in a savepoint: if that fails too (the error queue is
        missing, say), the message stays in the store and the rest of the batch moves on."""
        headers = {**message.headers, **failure_headers(exc, self.table)}
        headers[Headers.FAILED_ATTEMPTS] = str(failures)
        # FailedQ names the store (where it failed); a retry goes to the real destination.
        headers[Headers.DELAYED_DESTINATION] = message.destination
        if message.extra.get("raw_headers"):
            headers[Headers.RAW_HEADERS] = message.extra["raw_headers"]
        try:
            with transaction.atomic(using=self.using):
                self.transport.enqueue([self.transport.outgoing(self.error_queue, _message_id(message), headers,
                                                                message.body, forever=True)])
                self.clearing.forwarded([message])
        except Exception as error:  # noqa: BLE001 — kept in the store, logged, retried next time
            if isinstance(error, DatabaseError) and self._database_fault(error):
                raise _DispatchFailed(error) from error
            log.error("delayed message %s for %s could not be moved to %s (%s); it stays in the store",
                      message.id, message.destination, self.error_queue, error)
            return False
        log.error("delayed message %s for %s moved to %s after %d failed forward(s): %s",
                  message.id, message.destination, self.error_queue, failures, exc)
        return True


def _message_id(message: DelayedMessage) -> str:
    """The id a stored message is forwarded under: its MessageId header.  A delayed retry
    is stored under a key of its own (core.receive.recoverability.retry_key), never its id."""
    return message.headers.get(Headers.MESSAGE_ID) or message.id
