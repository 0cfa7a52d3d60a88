"""Sending failed messages back to their queues: a retry, or an edited copy (edit-and-retry).

The sent message keeps its message id and carries ``Sluice.RetryOf``; when a handler
then succeeds the pump calls :func:`~core.failures.lifecycle.mark_resolved` in the
receive's transaction.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Mapping

from django.db import transaction
from django.utils import timezone

from core.conf import get_settings
from core.errors import InvalidMessage, UnknownQueue
from core.failures.records import (POISON_TYPE, RETRIED_AT, RETRY_OF, RetryRefused, append_event, base, event,
                                   message_part, stored_headers)
from core.messages import Headers, encode_headers, wire_time
from core.models import FailedMessage, FailureStatus
from core.transport import Transport

log = logging.getLogger("sluice.failures")


def retry_headers(headers: Mapping[str, str], message_id: str, now: dt.datetime) -> dict[str, str]:
    """The headers a retried message carries: the failure headers removed, the retry counters
    reset, ``Sluice.RetryOf`` / ``Sluice.RetriedAt`` added, its message id kept."""
    out = message_part(headers)
    out[Headers.MESSAGE_ID] = message_id
    out[RETRY_OF] = message_id
    out[RETRIED_AT] = wire_time(now)
    return out


def _send(record: FailedMessage, headers: dict[str, str], body: bytes, using: str) -> None:
    """Into the record's original queue, with that queue's default TTL counted from now."""
    queue = (record.original_queue or "").split("@")[0]
    if not queue:
        raise RetryRefused("the original queue is unknown (no NServiceBus.FailedQ header)")
    transport = Transport(using)
    try:
        message = transport.outgoing(queue, record.message_id, headers, body)
    except (UnknownQueue, ValueError) as exc:
        raise RetryRefused(f"original queue {queue!r} no longer exists ({exc})") from None
    transport.enqueue([message])


def _mark_retried(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None,
                  **extra: Any) -> None:
    record.status = FailureStatus.RETRY_PENDING
    record.retried_at = now
    record.archived_at = None
    append_event(record, event("retry", now, exception_type=record.exception_type, by=by, operation=operation,
                               queue=record.original_queue, **extra))
    record.save(using=using, update_fields=["status", "retried_at", "archived_at", "history", "headers", "body"])


def send_back(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None) -> None:
    """Retry one record: its message back to its queue, the record retry-pending."""
    headers = stored_headers(record)
    if record.exception_type == POISON_TYPE and Headers.RAW_HEADERS in headers:
        raise RetryRefused("poison message: its original headers could not be read; "
                           "use edit-and-retry with corrected headers")
    _send(record, retry_headers(headers, record.message_id, now), bytes(record.body or b""), using)
    _mark_retried(record, now, by, using, operation)


def edit_and_retry(message_id: str, new_body: bytes, new_headers: Mapping[str, str] | None = None,
                   requested_by: str = "", using: str | None = None) -> FailedMessage:
    """Send a corrected copy of a failed message back to its queue (same message id), and keep
    the correction as the record's body / headers.  ``new_headers`` replace the stored ones
    (failure headers are dropped either way).  InvalidHeaders / InvalidMessage for bad input,
    RetryRefused when it cannot be sent."""
    using = using or get_settings().DATABASE
    if isinstance(new_body, str):
        new_body = new_body.encode("utf-8")
    if not isinstance(new_body, (bytes, bytearray, memoryview)):
        raise InvalidMessage("the edited body must be bytes or text")
    new_body = bytes(new_body)
    if len(new_body) > get_settings().MAX_BODY_BYTES:
        raise InvalidMessage(f"body is {len(new_body)} bytes; SLUICE_MAX_BODY_BYTES allows "
                             f"{get_settings().MAX_BODY_BYTES}")
    if new_headers is not None:
        encode_headers(new_headers)  # InvalidHeaders unless a flat string → string map
    with transaction.atomic(using=using):
        record = base(using).select_for_update().get(message_id=message_id)
        if record.status not in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED):
            raise RetryRefused(f"message {message_id} is {record.get_status_display()}; only unresolved or "
                               "archived messages can be edited and retried")
        stored = stored_headers(record)
        if new_headers is None and Headers.RAW_HEADERS in stored and record.exception_type == POISON_TYPE:
            raise RetryRefused("poison message: its original headers could not be read; give corrected headers")
        now = timezone.now()
        headers = retry_headers(dict(new_headers) if new_headers is not None else stored, record.message_id, now)
        headers.pop(Headers.RAW_HEADERS, None)
        changes = _changes(record, stored, new_body, new_headers)
        _send(record, headers, new_body, using)
        record.body = new_body
        if new_headers is not None:  # the failure description stays; the message part is the edited one
            failure = {k: v for k, v in stored.items() if k not in message_part(stored)}
            record.headers = encode_headers({**failure, **message_part(new_headers)})
        _mark_retried(record, now, requested_by, using, None, edited=True,
                      message="edited: " + ("; ".join(changes) or "no changes"))
    log.info("failed message %s edited and retried by %s", message_id, requested_by or "?")
    return record


def _changes(record: FailedMessage, stored: Mapping[str, str], new_body: bytes,
             new_headers: Mapping[str, str] | None) -> list[str]:
    """What an edit changed, for the record's history."""
    changes = []
    if new_body != bytes(record.body or b""):
        changes.append(f"body ({len(record.body or b'')} → {len(new_body)} bytes)")
    if new_headers is not None:
        before, after = message_part(stored), message_part(new_headers)
        added = sorted(set(after) - set(before))
        removed = sorted(set(before) - set(after))
        changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
        for label, keys in (("added", added), ("removed", removed), ("changed", changed)):
            if keys:
                changes.append(f"headers {label}: {', '.join(keys[:10])}")
    return changes
