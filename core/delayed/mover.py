"""Delayed delivery: the delayed-message store, and the mover that forwards due messages.

The store (one table per endpoint, ``<endpoint>.delayed``: Id, Destination, State,
Time, Headers, RetryCount, index on Time) keeps messages until they are due.  Due
times come from the database clock.  Any class with the :class:`DelayedMessageStore`
methods can replace the SQL store (``SLUICE_DELAYED_STORE``).

:class:`DelayedMover` is a loop: fetch up to ``batch_size`` due messages → put each
in its queue → remove them, all in one transaction when the store and the queues
share a database (exactly once), and again at once while messages are due.  When
nothing is due it sleeps until the next due time (at most ``max_sleep``) or until a
store anywhere makes an earlier message due: PostgreSQL ``LISTEN/NOTIFY`` across
processes, an in-process hub otherwise, and a short poll where the database cannot
notify (SQLite, SQL Server).

Several workers: they *elect one mover* through a lease row (core.lease) rather than
all polling — every due instant would otherwise wake every worker to race for the
same rows.  The fetch still locks rows and skips locked ones, so even two movers
overlapping during a lease hand-over never deliver a message twice.
"""
from __future__ import annotations

import datetime as dt
import importlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from django.db import DatabaseError, connections, transaction

from core.breakers import FailureRateCircuitBreaker, RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.db import writer_turn
from core.dialects import Dialect, dialect_for
from core.errors import InvalidMessage
from core.lease import Lease
from core.messages import Headers, decode_headers, encode_headers, parse_timespan, wire_time
from core.queues import registry, validate_name
from core.recoverability import failure_headers
from core.transport import OutgoingMessage, Transport, row_id_for

log = logging.getLogger("sluice.delayed")

NOTIFY_CHANNEL = "sluice_delayed"
MAX_DELAY_SECONDS = 100 * 365 * 24 * 3600


@dataclass
class DelayedMessage:
    """A message waiting in the delayed store."""

    id: str
    destination: str
    body: bytes
    headers: dict[str, str]
    due: dt.datetime | None = None  # None with ``delay``: the store computes it
    retry_count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def message_type(self) -> str | None:
        return self.headers.get(Headers.ENCLOSED_MESSAGE_TYPES)


@runtime_checkable
class DelayedMessageStore(Protocol):
    """The interface a delayed-message store implements (the SQL store is one)."""

    def setup_infrastructure(self) -> None:
        """Create what the store needs (tables); idempotent."""

    def store(self, message: DelayedMessage, delay: float | None = None) -> None:
        """Keep ``message`` until ``message.due`` (or ``delay`` seconds from now)."""

    def remove(self, message: DelayedMessage) -> bool:
        """Forget a forwarded message; False when it was already gone."""

    def increment_failure_count(self, message: DelayedMessage) -> bool:
        """Count a failed forward; False when the message was already gone."""

    def next(self) -> dt.datetime | None:
        """When the earliest stored message is due, or None when the store is empty."""

    def fetch_next_due(self, at: dt.datetime) -> DelayedMessage | None:
        """The earliest message due at ``at``, locked against other pollers, or None."""


# -- the SQL store -------------------------------------------------------------------------

class SqlDelayedStore:
    """The delayed store in a table of the Sluice database (any dialect)."""

    def __init__(self, using: str | None = None, table: str | None = None) -> None:
        settings = get_settings()
        self.using = using or settings.DATABASE
        self.table = validate_name(table or settings.delayed_table)
        self.store_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"delayed-store:{self.table}", settings.TIME_TO_TRIGGER_STORE_BREAKER)

    @property
    def dialect(self) -> Dialect:
        return dialect_for(connections[self.using], get_settings().SCHEMA)

    def _cursor(self):
        return connections[self.using].cursor()

    def setup_infrastructure(self) -> None:
        d = self.dialect
        with transaction.atomic(using=self.using), self._cursor() as cursor:
            lock = d.ddl_lock()
            if lock:
                cursor.execute(*lock)
            for sql, params in d.create_delayed_table(self.table):
                cursor.execute(sql, params)

    # -- storing ---------------------------------------------------------------------
    def store(self, message: DelayedMessage, delay: float | None = None) -> None:
        d = self.dialect
        headers = encode_headers(message.headers)
        if delay is not None:
            sql = d.delayed_insert_after(self.table)
            params = d.delayed_insert_params(message.id, message.destination, message.body,
                                             d.ttl_params(delay), headers)
        else:
            sql = d.delayed_insert_at(self.table)
            params = d.delayed_insert_params(message.id, message.destination, message.body,
                                             [d.datetime_param(message.due)], headers)
        try:
            with transaction.atomic(using=self.using), self._cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
                if row is None:
                    log.info("delayed message %s is already stored; kept the first", message.id)
                    return
                due = d.to_datetime(row[0])
                message.due = due
                if d.supports_notify:
                    cursor.execute(d.notify(), [NOTIFY_CHANNEL, f"{self.table}|{due.timestamp():.6f}"])
                transaction.on_commit(lambda: wake_hub.wake(self.table, due.timestamp()), using=self.using)
        except DatabaseError as exc:
            self.store_breaker.failure(exc)
            raise
        self.store_breaker.success()

    # -- the mover's side --------------------------------------------------------------------
    def _message(self, raw: tuple[Any, ...]) -> DelayedMessage:
        id_, destination, state, when, headers, retry_count = raw[:6]
        d = self.dialect
        text = headers if isinstance(headers, str) else bytes(headers).decode("utf-8", "replace")
        try:
            parsed = decode_headers(text)
            poison = None
        except Exception as exc:  # noqa: BLE001 — kept raw, sent to the error queue by the mover
            parsed, poison = {}, str(exc)
        message = DelayedMessage(id=str(id_), destination=destination, body=bytes(state or b""),
                                 headers=parsed, due=d.to_datetime(when), retry_count=int(retry_count))
        if poison:
            message.extra.update(poison=poison, raw_headers=text)
        return message

    def fetch_due(self, limit: int, at: dt.datetime | None = None) -> list[DelayedMessage]:
        """Up to ``limit`` due messages, earliest first, locked until the transaction ends.
        ``at`` None means the database's own now."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.delayed_fetch_due(self.table), d.delayed_fetch_params(d.datetime_param(at), limit))
            return [self._message(raw) for raw in cursor.fetchall()]

    def fetch_next_due(self, at: dt.datetime) -> DelayedMessage | None:
        batch = self.fetch_due(1, at)
        return batch[0] if batch else None

    def remove(self, message: DelayedMessage) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_remove(self.table), [message.id])
            return cursor.rowcount == 1

    def remove_many(self, messages: list[DelayedMessage]) -> int:
        """Forget forwarded messages in one statement; returns how many were there."""
        if not messages:
            return 0
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_remove_many(self.table, len(messages)), [m.id for m in messages])
            return cursor.rowcount

    def increment_failure_count(self, message: DelayedMessage) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_increment_failure(self.table), [message.id])
            return cursor.rowcount == 1

    def next_and_now(self) -> tuple[dt.datetime | None, dt.datetime]:
        """(earliest due time or None, the database's now) in one round trip."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.delayed_next(self.table), [])
            nxt, now = cursor.fetchone()
        return d.to_datetime(nxt), d.to_datetime(now)

    def next(self) -> dt.datetime | None:
        return self.next_and_now()[0]

    # -- operators ----------------------------------------------------------------------
    def list(self, limit: int = 1000) -> tuple[list[DelayedMessage], dt.datetime]:
        """Stored messages by due time, and the database's now (to tell due from scheduled)."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.delayed_list(self.table), [limit])
            rows = cursor.fetchall()
            if rows:
                now = d.to_datetime(rows[0][6])
            else:
                cursor.execute(d.delayed_next(self.table), [])
                now = d.to_datetime(cursor.fetchone()[1])
        return [self._message(raw) for raw in rows], now

    def deliver_now(self, message_id: str) -> bool:
        d = self.dialect
        with transaction.atomic(using=self.using), self._cursor() as cursor:
            cursor.execute(d.delayed_deliver_now(self.table), [message_id])
            found = cursor.rowcount == 1
            if found and d.supports_notify:
                cursor.execute(d.notify(), [NOTIFY_CHANNEL, f"{self.table}|0"])
            if found:
                transaction.on_commit(lambda: wake_hub.wake(self.table, 0.0), using=self.using)
        return found

    def delete(self, message_id: str) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_remove(self.table), [message_id])
            return cursor.rowcount == 1


def delayed_store(using: str | None = None) -> DelayedMessageStore:
    """The configured store (``SLUICE_DELAYED_STORE``) for a database alias."""
    path = get_settings().DELAYED_STORE
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(using=using)


# -- sending later -----------------------------------------------------------------------

def resolve_due(delay: Any = None, deliver_at: Any = None) -> tuple[float | None, dt.datetime | None]:
    """Validate a delay (seconds) or an absolute time.  Returns (delay, deliver_at) with at
    most one set, or (None, None) for "deliver now" (no delay, zero delay, a past time)."""
    if delay is not None and deliver_at is not None:
        raise InvalidMessage("give a delay or a delivery time, not both")
    if delay is not None:
        if isinstance(delay, dt.timedelta):
            delay = delay.total_seconds()
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            try:
                delay = float(str(delay))
            except ValueError:
                raise InvalidMessage(f"delay must be a number of seconds, not {delay!r}") from None
        if math.isnan(delay) or math.isinf(delay) or delay < 0:
            raise InvalidMessage(f"delay must be a finite number of seconds, 0 or more (got {delay!r})")
        if delay > MAX_DELAY_SECONDS:
            raise InvalidMessage(f"a delay of {delay:g} s is more than 100 years")
        return (float(delay), None) if delay > 0 else (None, None)
    if deliver_at is not None:
        if isinstance(deliver_at, str):
            try:
                deliver_at = dt.datetime.fromisoformat(deliver_at.replace("Z", "+00:00"))
            except ValueError:
                raise InvalidMessage(f"delivery time must be ISO 8601 with an offset, not {deliver_at!r}") from None
        if not isinstance(deliver_at, dt.datetime):
            raise InvalidMessage(f"delivery time must be a datetime, not {type(deliver_at).__name__}")
        if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
            raise InvalidMessage("delivery time must be timezone-aware (e.g. 2026-11-22T10:00:00Z); "
                                 "naive times are refused rather than guessed")
        deliver_at = deliver_at.astimezone(dt.timezone.utc)
        now = dt.datetime.now(dt.timezone.utc)
        if deliver_at > now + dt.timedelta(seconds=MAX_DELAY_SECONDS):
            raise InvalidMessage(f"delivery time {deliver_at.isoformat()} is more than 100 years away")
        # Already past: straight into the queue.  (This one comparison uses our clock; a
        # time a moment ahead of it still goes through the store, whose clock decides.)
        return (None, None) if deliver_at <= now else (None, deliver_at)
    return None, None


def store_outgoing(message: OutgoingMessage, using: str, delay: float | None,
                   deliver_at: dt.datetime | None) -> None:
    """Put a built message into the delayed store of ``using`` instead of its queue."""
    headers = dict(message.headers)
    estimate = deliver_at or dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=delay or 0)
    headers[Headers.DELIVER_AT] = wire_time(estimate)
    delayed = DelayedMessage(id=message.message_id, destination=message.queue, body=message.body,
                             headers=headers, due=deliver_at)
    delayed_store(using).store(delayed, delay=delay)


# -- waking movers ---------------------------------------------------------------------

class WakeHub:
    """Movers of this process, told when a store makes an earlier message due."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, tuple[str, Callable[[float], None]]] = {}

    def register(self, table: str, callback: Callable[[float], None]) -> int:
        with self._lock:
            key = id(callback)
            self._listeners[key] = (table, callback)
            return key

    def unregister(self, key: int) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def wake(self, table: str, due_epoch: float) -> None:
        with self._lock:
            targets = [cb for t, cb in self._listeners.values() if t == table]
        for callback in targets:
            callback(due_epoch)


wake_hub = WakeHub()


class PostgresListener(threading.Thread):
    """LISTENs on a connection of its own and hands each notification to a callback."""

    def __init__(self, using: str, callback: Callable[[str], None]) -> None:
        super().__init__(name="sluice-delayed-listen", daemon=True)
        self.settings_dict = dict(connections[using].settings_dict)
        self.callback = callback
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        s = self.settings_dict
        conninfo = make_conninfo(dbname=s["NAME"], user=s.get("USER") or None, password=s.get("PASSWORD") or None,
                                 host=s.get("HOST") or None, port=s.get("PORT") or None, connect_timeout=5)
        while not self._stop.is_set():
            try:
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.callback("*|0")  # (re)connected: something may have been missed
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self.callback(note.payload)
            except Exception as exc:  # noqa: BLE001 — a lost listener must not kill the mover
                log.warning("delayed-message listener lost its connection (%s); retrying", exc)
                self._stop.wait(2.0)


# -- the mover ---------------------------------------------------------------------------

class _Phase(Exception):
    """Marks which breaker a failure belongs to."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.phase, self.cause = phase, cause


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
        self.transport = Transport(self.using)
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
                self._listener = PostgresListener(self.using, self._on_notify)
                self._listener.start()

    # -- waking ---------------------------------------------------------------------
    def bind_wake(self, wake: Callable[[], None]) -> None:
        """The runner's way to cut this loop's wait short."""
        self._wake = wake

    def _on_store(self, due_epoch: float) -> None:
        if due_epoch < self._sleep_until:
            self._wake()

    def _on_notify(self, payload: str) -> None:
        table, _, epoch = payload.rpartition("|")
        if table in (self.table, "*"):
            try:
                self._on_store(float(epoch))
            except ValueError:
                self._wake()

    # -- the loop -----------------------------------------------------------------------
    def step(self) -> float:
        # Until this step decides how long to sleep, any store must wake us: one that
        # commits after our "next due" query would otherwise be slept through.
        self._sleep_until = math.inf
        try:
            if self.lease is not None and not self._guard("fetch", self.lease.acquire):
                return self._sleep(self.lease.follower_wait())
            moved = self.move_due()
        except _Phase as failure:
            breaker = self.fetch_breaker if failure.phase == "fetch" else self.dispatch_breaker
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
            nxt, now = self._guard("fetch", self._next_and_now)
        except _Phase as failure:
            return self._sleep(self.fetch_breaker.failure(failure.cause))
        wait = self.max_sleep if nxt is None else min(max((nxt - now).total_seconds(), 0.0), self.max_sleep)
        if self._poll is not None:
            wait = min(wait, self._poll)
        if self.lease is not None:
            wait = min(wait, self.lease.renew_every)
        return self._sleep(wait)

    def _sleep(self, seconds: float) -> float:
        self._sleep_until = time.time() + seconds
        return seconds

    def _next_and_now(self) -> tuple[dt.datetime | None, dt.datetime]:
        if isinstance(self.store, SqlDelayedStore):
            return self.store.next_and_now()
        return self.store.next(), dt.datetime.now(dt.timezone.utc)

    @staticmethod
    def _guard(phase: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except DatabaseError as exc:
            raise _Phase(phase, exc) from exc

    def close(self) -> None:
        wake_hub.unregister(self._hub_key)
        if self._listener is not None:
            self._listener.stop()
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
        """Move one batch of due messages.  First all in one go; if anything in it fails,
        the batch rolls back and is moved again one savepoint per message, so one bad
        message neither blocks nor duplicates the others.  A failure of the connection
        itself (refused, lost) is the database's, not a message's: it goes to the breakers."""
        try:
            return self._move_batch(isolate=False)
        except _Phase as failure:
            if failure.phase == "fetch":
                raise
            log.info("batch move failed (%s); moving message by message", failure.cause)
        except DatabaseError as exc:
            if not self._connection_usable():
                raise _Phase("fetch", exc) from exc
            log.info("batch move failed (%s); moving message by message", exc)
        except Exception as exc:  # noqa: BLE001 — a message-level failure: isolate it
            log.info("batch move failed (%s); moving message by message", exc)
        try:
            return self._move_batch(isolate=True)
        except DatabaseError as exc:  # per-message errors are handled inside
            raise _Phase("dispatch" if self._connection_usable() else "fetch", exc) from exc

    def _connection_usable(self) -> bool:
        conn = connections[self.using]
        return conn.connection is not None and conn.is_usable()

    def _move_batch(self, isolate: bool) -> int:
        with writer_turn(self.using), transaction.atomic(using=self.using):
            batch = self._fetch_batch()
            if isolate:
                for message in batch:
                    self._forward_one(message)
            elif batch:
                self._forward_all(batch)
        if batch:
            log.debug("moved %d delayed message(s) from %s", len(batch), self.table)
        return len(batch)

    def _fetch_batch(self) -> list[DelayedMessage]:
        fetch_due = getattr(self.store, "fetch_due", None)
        if fetch_due is not None:
            return self._guard("fetch", lambda: fetch_due(self.batch_size))
        # A store with only the interface: one at a time (it locks what it hands out).
        now = dt.datetime.now(dt.timezone.utc)
        batch: list[DelayedMessage] = []
        while len(batch) < self.batch_size:
            message = self._guard("fetch", lambda: self.store.fetch_next_due(now))
            if message is None:
                break
            batch.append(message)
        return batch

    def _forward_one(self, message: DelayedMessage) -> None:
        """Forward in a savepoint; a failure is counted, or sends it to the error queue."""
        try:
            with transaction.atomic(using=self.using):
                self._forward(message)
        except DatabaseError as exc:
            if not connections[self.using].is_usable():
                raise _Phase("dispatch", exc) from exc
            self._forward_failed(message, exc)
        except Exception as exc:  # noqa: BLE001 — recorded per message below
            self._forward_failed(message, exc)

    def _outgoing(self, message: DelayedMessage, delivered_at: str) -> OutgoingMessage:
        """The queue row for a due message; its TTL starts now, when it lands."""
        if message.extra.get("poison"):
            raise InvalidMessage(f"stored headers cannot be read: {message.extra['poison']}")
        info = registry.get(message.destination, self.using)  # UnknownQueue: a clear reason
        headers = {**message.headers, Headers.DELIVERED_AT: delivered_at}
        ttl = None
        if Headers.TIME_TO_BE_RECEIVED in headers:
            try:
                ttl = parse_timespan(headers[Headers.TIME_TO_BE_RECEIVED])
            except ValueError:
                ttl = None
        return OutgoingMessage(
            queue=info.name, row_id=row_id_for(message.id), headers=headers, body=message.body,
            correlation_id=headers.get(Headers.CORRELATION_ID), reply_to=headers.get(Headers.REPLY_TO_ADDRESS),
            ttl_seconds=info.effective_ttl(ttl))

    def _forward_all(self, batch: list[DelayedMessage]) -> None:
        """The fast path: the whole batch in a constant number of statements (one insert
        per destination queue, one delete).  Any failure sends the caller to the
        per-message path."""
        delivered_at = wire_time(dt.datetime.now(dt.timezone.utc))
        outgoing = [self._outgoing(m, delivered_at) for m in batch]
        remove_many = getattr(self.store, "remove_many", None)
        try:
            self.transport.insert_many(outgoing)
            if remove_many is not None:
                remove_many(batch)
            else:
                for message in batch:
                    self.store.remove(message)
        except DatabaseError as exc:
            raise _Phase("dispatch", exc) from exc
        self.moved += len(batch)

    def _forward(self, message: DelayedMessage) -> None:
        """Put one message in its queue and take it out of the store."""
        outgoing = self._outgoing(message, wire_time(dt.datetime.now(dt.timezone.utc)))
        try:
            self.transport.insert(outgoing)
            self.store.remove(message)
        except DatabaseError as exc:
            raise _Phase("dispatch", exc) from exc
        self.moved += 1

    def _forward_failed(self, message: DelayedMessage, exc: BaseException) -> None:
        """``number_of_retries`` failed forwards are retried; the next one goes to the error
        queue.  So a message is forwarded at most number_of_retries + 1 times."""
        self.failed += 1
        pause = self.recovery_breaker.failure(exc)
        failures = message.retry_count + 1
        if failures <= self.number_of_retries:
            self.store.increment_failure_count(message)
            log.warning("forwarding delayed message %s to %s failed (%d of %d): %s", message.id,
                        message.destination, failures, self.number_of_retries + 1, exc)
        else:
            headers = {**message.headers, **failure_headers(exc, self.table)}
            headers[Headers.FAILED_ATTEMPTS] = str(failures)
            # FailedQ names the store (where it failed); a retry goes to the real destination.
            headers[Headers.DELAYED_DESTINATION] = message.destination
            if message.extra.get("raw_headers"):
                headers[Headers.RAW_HEADERS] = message.extra["raw_headers"]
            headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
            self.transport.insert(OutgoingMessage(
                queue=self.error_queue, row_id=row_id_for(message.id), headers=headers, body=message.body,
                correlation_id=headers.get(Headers.CORRELATION_ID), reply_to=None, ttl_seconds=None))
            self.store.remove(message)
            log.error("delayed message %s for %s moved to %s after %d failed forward(s): %s",
                      message.id, message.destination, self.error_queue, failures, exc)
        # Never sleep here: this runs inside the batch's transaction, holding row locks.
        self._recovery_pause = max(self._recovery_pause, pause)
