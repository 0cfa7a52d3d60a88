"""Ingestion: error-queue messages become :class:`~core.models.FailedMessage` records.

:func:`ingest_batch` receives a batch from the error queue and upserts one record per
message id and queue in the same transaction — one INSERT for the new records and one UPDATE for
the known ones — so the error rows are deleted only when the records commit: a crash
loses and doubles nothing.  A message that fails again (after a retry) comes back to the
same record: ``failure_count`` goes up, the status goes back to unresolved, and its
history grows.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from core.runtime.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.errors import UnknownQueue
from core.failures.grouping import group_of
from core.failures.records import MAX_IN, POISON_TYPE, append_event, base, event, short
from core.runtime.loops import discard_connection
from core.messages import Headers, Message, encode_headers, parse_wire_time, storable_text
from core.models import FailedMessage, FailureStatus
from core.scheduling import delayed_store, store_name
from core.transport import Transport

log = logging.getLogger("sluice.failures")

#: The fields an ingested failure sets on an existing record (one UPDATE for the batch).
INGESTED_FIELDS = ("original_queue", "message_type", "exception_type", "exception_message", "stack_trace",
                   "group_key", "group_title", "time_of_failure", "attempts", "failure_count", "status",
                   "headers", "body", "first_failed_at", "last_failed_at", "resolved_at", "archived_at", "history",
                   "conversation_id", "related_to", "correlation_id")


@dataclass
class Failure:
    """What one error-queue message says about its failure."""

    message_id: str
    original_queue: str
    message_type: str
    exception_type: str
    exception_message: str
    stack_trace: str
    time_of_failure: dt.datetime
    attempts: int
    headers: dict[str, str]
    body: bytes
    #: Where the message belongs (the conversation view): ConversationId, RelatedTo, CorrelationId.
    conversation_id: str = ""
    related_to: str = ""
    correlation_id: str = ""


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def record_id(message_id: str) -> str:
    """The record's key for a message id (long ids are hashed to fit the column)."""
    return message_id if len(message_id) <= 255 else "sha1:" + hashlib.sha1(message_id.encode()).hexdigest()


def original_queue(headers: dict[str, str], delayed_store_name: str) -> str:
    """Where the message failed, which is where an operator's retry sends it: ``FailedQ``,
    except for a message the delayed mover could not forward (``FailedQ`` names the delayed
    store), whose retry goes to its ``Sluice.DelayedDestination``.  That header is trusted
    only then: a producer or another endpoint cannot steer retries elsewhere with it."""
    failed_q = headers.get(Headers.FAILED_Q, "")
    if failed_q == delayed_store_name and headers.get(Headers.DELAYED_DESTINATION):
        return headers[Headers.DELAYED_DESTINATION][:255]
    return failed_q[:255]


def failure_of(message: Message, now: dt.datetime, delayed_store_name: str = "") -> Failure:
    if message.poison:
        # Unreadable headers written straight into the error queue: keep the raw text.
        headers = {Headers.MESSAGE_ID: message.id, Headers.RAW_HEADERS: message.raw_headers or ""}
        return Failure(message_id=message.id, original_queue="", message_type="", exception_type=POISON_TYPE,
                       exception_message=message.poison, stack_trace="", time_of_failure=now, attempts=0,
                       headers=headers, body=message.body or b"")
    h = message.headers
    when = now
    if h.get(Headers.TIME_OF_FAILURE):
        try:
            when = parse_wire_time(h[Headers.TIME_OF_FAILURE])
        except ValueError:
            pass
    attempts = _int(h.get(Headers.TOTAL_FAILED_ATTEMPTS))
    if attempts is None:
        attempts = _int(h.get(Headers.FAILED_ATTEMPTS)) or 0
    types = message.message_types()
    failure = Failure(
        message_id=record_id(storable_text(h.get(Headers.MESSAGE_ID) or message.id)),
        original_queue=original_queue(h, delayed_store_name),
        message_type=(types[0] if types else "")[:255],
        exception_type=h.get(Headers.EXCEPTION_TYPE, "")[:500],
        exception_message=h.get(Headers.EXCEPTION_MESSAGE, ""),
        stack_trace=h.get(Headers.EXCEPTION_STACK_TRACE, ""),
        time_of_failure=when,
        attempts=attempts,
        headers=dict(h),
        body=message.body or b"",
        **conversation_of(h),
    )
    # The record's columns describe the failure; its headers keep every value exactly.
    # Text a column cannot hold (a lone surrogate from another system's header or from
    # exception text, a NUL) would refuse the batch's INSERT, every time (issue 34).
    return dataclasses.replace(failure, **{name: storable_text(getattr(failure, name)) for name in _TEXT_FIELDS})


#: The Failure fields written to text columns as they are.
_TEXT_FIELDS = ("original_queue", "message_type", "exception_type", "exception_message", "stack_trace",
                "conversation_id", "related_to", "correlation_id")


def conversation_of(headers: dict[str, str]) -> dict[str, str]:
    """The conversation columns of a failed message, from its headers (cut to the columns;
    also the data migration's, for the records ingested before they existed)."""
    return {"conversation_id": (headers.get(Headers.CONVERSATION_ID) or "")[:200],
            "related_to": (headers.get(Headers.RELATED_TO) or "")[:200],
            "correlation_id": (headers.get(Headers.CORRELATION_ID) or "")[:255]}


def apply_failure(record: FailedMessage | None, f: Failure, now: dt.datetime) -> FailedMessage:
    """The record (a new one when None) updated with failure ``f``; not saved."""
    key, title = group_of(f.exception_type, f.stack_trace)
    entry = event("failed", now, exception_type=f.exception_type, message=short(f.exception_message),
                  queue=f.original_queue, attempts=f.attempts, time_of_failure=f.time_of_failure.isoformat())
    if record is None:
        record = FailedMessage(message_id=f.message_id, first_failed_at=f.time_of_failure, failure_count=0,
                               history=[])
    else:
        record.first_failed_at = min(record.first_failed_at, f.time_of_failure)
    record.original_queue = f.original_queue
    record.message_type = f.message_type
    record.exception_type = f.exception_type
    record.exception_message = f.exception_message
    record.stack_trace = f.stack_trace
    record.group_key, record.group_title = key, title
    record.time_of_failure = f.time_of_failure
    record.attempts = f.attempts
    record.failure_count += 1
    record.status = FailureStatus.UNRESOLVED
    record.headers = encode_headers(f.headers)
    record.body = f.body
    record.last_failed_at = now
    record.resolved_at = None
    record.archived_at = None
    record.conversation_id, record.related_to, record.correlation_id = \
        f.conversation_id, f.related_to, f.correlation_id
    append_event(record, entry)
    return record


def ingest_batch(batch_size: int | None = None, using: str | None = None,
                 queue: str | None = None) -> int:
    """Ingest up to ``batch_size`` error-queue messages in one transaction; returns how many."""
    using = using or get_settings().DATABASE
    queue = queue or get_settings().ERROR_QUEUE
    batch_size = batch_size or get_settings().ERROR_INGESTION_BATCH_SIZE
    with transaction.atomic(using=using):
        messages = Transport(using).receive_batch(queue, batch_size)
        if not messages:
            return 0
        now = timezone.now()
        store = store_name(delayed_store(using))
        failures = [failure_of(m, now, store) for m in messages]
        # One record per message id AND queue: two queues' messages may share an id
        # (explicit ids, send_many(message_id=...)), and each must be retried on its own.
        records = {(r.message_id, r.original_queue): r for r in
                   base(using).select_for_update().filter(message_id__in={f.message_id for f in failures})}
        for f in failures:  # a batch may hold the same message twice: both land in its record
            key = (f.message_id, f.original_queue)
            records[key] = apply_failure(records.get(key), f, now)
        known = [r for r in records.values() if r.pk is not None]
        new = [r for r in records.values() if r.pk is None]
        if new:
            base(using).bulk_create(new)
        if known:
            base(using).bulk_update(known, INGESTED_FIELDS)
    log.info("ingested %d failed message(s) from %s", len(messages), queue)
    return len(messages)


def ingest_errors(batch_size: int | None = None, max_batches: int | None = None,
                  using: str | None = None, queue: str | None = None) -> int:
    """Ingest the error queue in batches (each its own transaction) until a batch comes back
    short or ``max_batches`` ran.  Returns how many messages became (or updated) records."""
    batch_size = batch_size or get_settings().ERROR_INGESTION_BATCH_SIZE
    if not 1 <= batch_size <= MAX_IN:
        raise ValueError(f"batch_size must be between 1 and {MAX_IN}")
    total = batches = 0
    while max_batches is None or batches < max_batches:
        got = ingest_batch(batch_size, using, queue)
        total += got
        batches += 1
        if got < batch_size:
            break
    return total


class ErrorIngestor:
    """A loop (core.runtime.loops): turns error-queue messages into failed-message records."""

    name = "error-ingestion"

    def __init__(self, batch_size: int | None = None, using: str | None = None, queue: str | None = None,
                 interval: float | None = None) -> None:
        settings = get_settings()
        self.batch_size = batch_size or settings.ERROR_INGESTION_BATCH_SIZE
        self.using = using or settings.DATABASE
        self.queue = queue or settings.ERROR_QUEUE
        self.interval = settings.INGEST_INTERVAL if interval is None else interval
        self.ingested = 0
        self.breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"error-ingestion:{self.queue}", settings.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        self._missing_logged = False

    def step(self) -> float:
        try:
            got = ingest_batch(self.batch_size, self.using, self.queue)
        except UnknownQueue:
            if not self._missing_logged:
                log.warning("error queue %s does not exist yet: nothing to ingest (run `sluice setup`)", self.queue)
                self._missing_logged = True
            return max(self.interval, 10.0)
        except IntegrityError:
            # Another ingestor created the same message's record first; ours rolled back
            # (the error rows with it).  Next time the record exists and is updated.
            discard_connection(self.using)
            return 0.0
        except DatabaseError as exc:
            discard_connection(self.using)
            return self.breaker.failure(exc)
        self.breaker.success()
        self._missing_logged = False
        self.ingested += got
        return 0.0 if got >= self.batch_size else self.interval

    def close(self) -> None:
        pass
