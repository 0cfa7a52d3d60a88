"""Sending failed messages back to their queues: a retry, or an edited copy (edit-and-retry).

A retried message keeps its message id; an edited one is a copy with a new id (and
``Sluice.EditOf``).  Both carry ``Sluice.RetryOf``; when a handler then succeeds the pump calls :func:`~core.failures.lifecycle.mark_resolved` in the
receive's transaction.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Mapping, NamedTuple

from django.db import transaction
from django.utils import timezone

from core.conf import get_settings
from core.errors import InvalidMessage, UnknownQueue
from core.failures.records import (EDIT_OF, POISON_TYPE, RETRIED_AT, RETRY_OF, RetryRefused, append_event, base, event,
                                   in_queue, message_part, stored_headers)
from core.messages import Headers, encode_headers, wire_time
from core.models import FailedMessage, FailureStatus
from core.outgoing import new_id
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


def _send(record: FailedMessage, headers: dict[str, str], body: bytes, using: str,
          message_id: str | None = None) -> None:
    """Into the record's original queue (as ``message_id``, by default the record's own),
    with that queue's default TTL counted from now."""
    queue = (record.original_queue or "").split("@")[0]
    if not queue:
        raise RetryRefused("the original queue is unknown (no NServiceBus.FailedQ header)")
    transport = Transport(using)
    try:
        message = transport.outgoing(queue, message_id or record.message_id, headers, body)
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


class EditedCopy(NamedTuple):
    """What :func:`edit_and_retry` did: the (now resolved) record and the copy's message id."""

    record: FailedMessage
    message_id: str


def edit_and_retry(message_id: str, new_body: bytes | str, new_headers: Mapping[str, str] | None = None,
                   requested_by: str = "", using: str | None = None, queue: str | None = None) -> EditedCopy:
    """Send a corrected copy of a failed message to its queue and mark the original resolved,
    in one transaction.  The copy gets a new message id and carries the original's as its
    correlation id (and in ``Sluice.EditOf``), so the two stay linked; the record keeps the
    original body and headers, and its history says what the edit changed.  ``new_headers``
    replace the stored message headers (the failure description is dropped either way).
    ``queue`` names the queue it failed in, needed only when the id failed in several.
    InvalidHeaders / InvalidMessage for bad input, RetryRefused when it cannot be sent."""
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
        found = list(in_queue(base(using).select_for_update().filter(message_id=message_id), queue)[:2])
        if not found:
            raise RetryRefused(f"no failed message {message_id!r}" + (f" from {queue}" if queue else ""))
        if len(found) > 1:
            raise RetryRefused(f"message id {message_id!r} failed in several queues "
                               f"({', '.join(sorted(r.original_queue for r in found))}): name the queue")
        (record,) = found
        if record.status not in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED):
            raise RetryRefused(f"message {message_id} is {record.get_status_display()}; only unresolved or "
                               "archived messages can be edited and retried")
        stored = stored_headers(record)
        if new_headers is None and Headers.RAW_HEADERS in stored and record.exception_type == POISON_TYPE:
            raise RetryRefused("poison message: its original headers could not be read; give corrected headers")
        now = timezone.now()
        copy_id = new_id()
        headers = retry_headers(dict(new_headers) if new_headers is not None else stored, record.message_id, now)
        headers.pop(Headers.RAW_HEADERS, None)
        headers.update({Headers.MESSAGE_ID: copy_id, Headers.CORRELATION_ID: record.message_id,
                        EDIT_OF: record.message_id})
        changes = _changes(record, stored, new_body, new_headers)
        _send(record, headers, new_body, using, copy_id)
        record.status = FailureStatus.RESOLVED
        record.resolved_at = now
        record.archived_at = None
        append_event(record, event("resolved", now, exception_type=record.exception_type, by=requested_by,
                                   queue=record.original_queue, edited=True, new_message_id=copy_id,
                                   message=f"edited and retried as a copy, message id {copy_id}: "
                                           + ("; ".join(changes) or "no changes")))
        record.save(using=using, update_fields=["status", "resolved_at", "archived_at", "history"])
    log.info("failed message %s edited and retried as %s by %s", message_id, copy_id, requested_by or "?")
    return EditedCopy(record, copy_id)


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
