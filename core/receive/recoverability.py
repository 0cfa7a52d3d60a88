"""What happens when a handler fails, or a row cannot be read at all.

1. Immediate retries: the failed message goes back into its queue, in the same
   transaction that rolled its handler back, with ``Sluice.FailedAttempts`` counted up.
2. Delayed retries: after the last immediate retry it goes to the delayed store, due
   in 10 s, then 20 s, then 30 s (``NServiceBus.Retries`` counts them; each delayed
   retry starts a new round of immediate retries).
3. Then the error queue, with the ``NServiceBus.ExceptionInfo.*`` / ``FailedQ``
   headers.  Poison rows and messages with no handler go there at once.

Every count lives in the message's own headers, in the same transaction as the
receive, so it survives restarts and spans workers.  Each of these writes runs in a
savepoint: one the database refuses for the message's sake sets that message aside
(core.receive.last_resort) instead of rolling its batch back for ever.

Logged as NServiceBus does: an immediate retry at INFO, a delayed retry at WARNING, the
move to the error queue (and a message set aside) at ERROR.
"""
from __future__ import annotations

import datetime as dt
import enum
import logging
import uuid
from typing import Callable, TypeVar

from django.db import transaction

from core.conf import get_settings
from core.errors import PoisonMessage
from core.handlers import HandlerRegistry, handlers
from core.messages import Headers, Message, failure_headers, wire_time
from core.models import QueueKind
from core.receive.last_resort import guarded
from core.scheduling import DelayedMessage
from core.transport import Transport

log = logging.getLogger("sluice.recoverability")

T = TypeVar("T")

#: The write each outcome makes, as the log and ``Sluice.PoisonReason`` name it.
WRITES = {"retry": "the immediate retry's re-insert", "delayed-retry": "the delayed retry's store",
          "error": "the move to the error queue"}

#: Namespace of the delayed store's keys for delayed retries (:func:`retry_key`).
_RETRY_KEYS = uuid.UUID("6f1d3c2e-5b0a-4f55-9c1e-7a8d2f4b9e10")


def retry_key(message: Message, number: int) -> str:
    """The delayed store's key for delayed retry ``number`` of the row ``message``.

    Not the MessageId: ids need not be unique (``send_many(..., message_id=X)``, two
    queues' copies of one message), and the store keeps the first of two rows with one
    key, so a retry under its MessageId could be dropped for another message's.  The
    queue, RowVersion, id and retry number name one failure of one row: a retry stored
    twice for the same failure (a receive rolled back after storing it elsewhere) is
    still stored once.  The mover forwards it under the id in its headers."""
    name = "\0".join((message.queue, str(message.row_version), message.id, str(number)))
    return f"retry-{uuid.uuid5(_RETRY_KEYS, name)}"


class FailureOutcome(str, enum.Enum):
    """Where a failed message went (a str, so ``outcome == "error"`` still reads)."""

    RETRY = "retry"                  # back into its queue for an immediate retry
    DELAYED_RETRY = "delayed-retry"  # into the delayed store
    ERROR = "error"                  # into the error queue


class Recoverability:
    """Retry-or-error decisions for one transport (the receive's connection)."""

    def __init__(self, transport: Transport, immediate_retries: int | None = None,
                 error_queue: str | None = None, delayed_retries: int | None = None,
                 delayed_retry_increase: float | None = None, registry: HandlerRegistry | None = None) -> None:
        settings = get_settings()
        self.transport = transport
        #: Where failure hooks are found: the pump's own handler registry.
        self.registry = registry or handlers
        self.immediate_retries = settings.IMMEDIATE_RETRIES if immediate_retries is None else immediate_retries
        self.delayed_retries = settings.DELAYED_RETRIES if delayed_retries is None else delayed_retries
        self.delayed_retry_increase = (settings.DELAYED_RETRY_INCREASE if delayed_retry_increase is None
                                       else delayed_retry_increase)
        self.error_queue = error_queue or settings.ERROR_QUEUE

    def guarded(self, message: Message, write: str, record: Callable[[], T]) -> T | None:
        """``record()`` (a write recording ``message``'s outcome) in a savepoint; None when
        the database refused it and the message was set aside (core.receive.last_resort)."""
        return guarded(self.transport, self.error_queue, message, write, record)

    def decide(self, message: Message) -> FailureOutcome:
        """Where a failed attempt of ``message`` takes it (from the counts on its row, against
        the retry limits its message type gives it, else the pump's)."""
        immediate, delayed = self.registry.retry_limits(message.queue, message)
        immediate = self.immediate_retries if immediate is None else immediate
        delayed = self.delayed_retries if delayed is None else delayed
        if message.failed_attempts + 1 <= immediate:
            return FailureOutcome.RETRY
        if message.delayed_retries < delayed:
            return FailureOutcome.DELAYED_RETRY
        return FailureOutcome.ERROR

    def on_failure(self, message: Message, exc: BaseException) -> FailureOutcome:
        """Record a failed attempt; returns where the message went (ERROR too when the
        database refused the write and the message was set aside)."""
        outcome = self.decide(message)
        done = self.guarded(message, WRITES[outcome.value], lambda: self._record(message, exc, outcome))
        outcome = FailureOutcome.ERROR if done is None else outcome
        self._tell_hook(message, exc, outcome)
        return outcome

    def _tell_hook(self, message: Message, exc: BaseException, outcome: FailureOutcome) -> None:
        """The message type's failure hook (core.handlers), in a savepoint of its own: a hook
        that fails costs its own record, never the message's retry or move."""
        hook = self.registry.failure_hook(message.queue, message)
        if hook is None:
            return
        using = self.transport.using
        try:
            with transaction.atomic(using=using):
                hook(message, exc, outcome.value, using)
        except Exception:
            log.exception("the failure hook for message %s on %s failed", message.id, message.queue)

    def _record(self, message: Message, exc: BaseException, outcome: FailureOutcome) -> bool:
        attempts = message.failed_attempts + 1
        total = message.total_failed_attempts + 1
        if outcome is FailureOutcome.RETRY:
            headers = {**message.headers, Headers.FAILED_ATTEMPTS: str(attempts),
                       Headers.TOTAL_FAILED_ATTEMPTS: str(total)}
            self.transport.move(message, message.queue, headers, keep_expiry=True)
            # INFO, as NServiceBus logs it: a retry is routine, the error queue is what matters.
            log.info("message %s on %s failed (attempt %d of %d): %s: %s", message.id, message.queue,
                     attempts, self.immediate_retries + 1, type(exc).__name__, exc)
        elif outcome is FailureOutcome.DELAYED_RETRY:
            self.schedule_delayed_retry(message, exc, message.delayed_retries + 1, total)
        else:
            self._move_to_error(message, exc, attempts)
        return True

    def schedule_delayed_retry(self, message: Message, exc: BaseException, number: int, total: int) -> None:
        delay = self.delayed_retry_increase * number
        headers = {**message.headers,
                   Headers.FAILED_ATTEMPTS: "0",  # a new round of immediate retries
                   Headers.TOTAL_FAILED_ATTEMPTS: str(total),
                   Headers.DELAYED_RETRIES: str(number),
                   Headers.DELAYED_RETRIES_TIMESTAMP: wire_time(dt.datetime.now(dt.timezone.utc))}
        headers.setdefault(Headers.MESSAGE_ID, message.id)  # the mover forwards it under this id
        stored = self.transport.delayed.store(
            DelayedMessage(id=retry_key(message, number), destination=message.queue,
                           body=message.body, headers=headers), delay=delay)
        if stored is False:  # the SQL store's "that key is there already": this very retry
            log.warning("delayed retry %d of message %s on %s was already stored (the same failure of "
                        "the same row); kept that one", number, message.id, message.queue)
        log.warning("message %s on %s failed %d time(s); delayed retry %d of %d in %g s: %s: %s",
                    message.id, message.queue, total, number, self.delayed_retries, delay,
                    type(exc).__name__, exc)

    def move_to_error(self, message: Message, exc: BaseException, attempts: int | None = None) -> None:
        """To the error queue at once (no handler for its type)."""
        self.guarded(message, WRITES["error"], lambda: self._move_to_error(message, exc, attempts))

    def _move_to_error(self, message: Message, exc: BaseException, attempts: int | None = None) -> None:
        headers = {**message.headers, **failure_headers(exc, message.queue)}
        headers[Headers.FAILED_ATTEMPTS] = str(attempts if attempts is not None else message.failed_attempts + 1)
        headers[Headers.TOTAL_FAILED_ATTEMPTS] = str(message.total_failed_attempts + 1)
        # Error-queue messages wait for an operator: no expiry, no TTL header.
        headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
        # It failed here, in its own queue: a DelayedDestination another endpoint wrote into
        # the row must not steer an operator's retry elsewhere.
        headers.pop(Headers.DELAYED_DESTINATION, None)
        self.transport.move_to_holding(message, self.error_queue, headers, QueueKind.ERROR)
        log.error("message %s on %s moved to %s after %s attempt(s): %s: %s", message.id, message.queue,
                  self.error_queue, headers[Headers.FAILED_ATTEMPTS], type(exc).__name__, exc)

    def move_poison(self, message: Message) -> None:
        """A row whose headers cannot be parsed: to the error queue at once, body untouched,
        the original header text kept in ``Sluice.RawHeaders``."""
        self.guarded(message, "the poison row's move to the error queue", lambda: self._move_poison(message))

    def _move_poison(self, message: Message) -> None:
        exc = PoisonMessage(message.poison or "unreadable message")
        headers = failure_headers(exc, message.queue)
        headers[Headers.RAW_HEADERS] = message.raw_headers
        headers[Headers.MESSAGE_ID] = message.id
        self.transport.move_to_holding(message, self.error_queue, headers, QueueKind.ERROR)
        log.error("poison message %s on %s moved to %s: %s", message.id, message.queue, self.error_queue, exc)
