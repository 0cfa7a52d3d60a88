"""What every part of core.failures shares: the record's history, its stored headers, the
headers a retry adds or drops, and the limits."""
from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterator, Mapping

from django.db.models import Q, QuerySet

from core.errors import PoisonMessage, SluiceError
from core.messages import Headers
from core.models import FailedMessage

#: Archived records one purge statement deletes.
FAILED_PURGE_BATCH_SIZE = 1000
#: History events kept per record (the newest; a message failing forever must not grow without bound).
HISTORY_LIMIT = 100
#: Reasons kept in BulkOperation.error.
MAX_ERROR_LINES = 50
#: Parameters in one ``IN (...)`` (SQL Server allows 2,100 per statement).
MAX_IN = 500

#: Header on a retried message: the failed record it retries (its message id).
RETRY_OF = Headers.RETRY_OF
#: Header on a retried message: when the retry was sent (wire time).
RETRIED_AT = "Sluice.RetriedAt"
#: Header on an edited copy (edit-and-retry): the failed message it replaces.
EDIT_OF = "Sluice.EditOf"
POISON_TYPE = f"{PoisonMessage.__module__}.{PoisonMessage.__qualname__}"

#: Headers a retry removes: the failure description and the retry counters (a retried
#: message gets a fresh set of immediate and delayed retries).
FAILURE_HEADERS = (
    Headers.EXCEPTION_TYPE, Headers.EXCEPTION_MESSAGE, Headers.EXCEPTION_STACK_TRACE, Headers.EXCEPTION_SOURCE,
    Headers.FAILED_Q, Headers.TIME_OF_FAILURE, Headers.FAILED_ATTEMPTS, Headers.TOTAL_FAILED_ATTEMPTS,
    Headers.DELAYED_RETRIES, Headers.DELAYED_RETRIES_TIMESTAMP, Headers.TIME_TO_BE_RECEIVED, RETRIED_AT,
)
EXCEPTION_INFO_PREFIX = "NServiceBus.ExceptionInfo."


class RetryRefused(SluiceError):
    """A failed message cannot be sent back (its queue is gone, its headers unreadable…)."""


def base(using: str) -> QuerySet:
    return FailedMessage.objects.using(using)


def chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def event(name: str, at: dt.datetime, **fields: Any) -> dict[str, Any]:
    """A history entry: ``{"at", "event", …}`` without empty fields."""
    return {"at": at.isoformat(), "event": name, **{k: v for k, v in fields.items() if v not in (None, "")}}


def append_event(record: FailedMessage, entry: dict[str, Any]) -> None:
    record.history = [*(record.history or []), entry][-HISTORY_LIMIT:]


def short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def headers_of(record: FailedMessage) -> dict[str, str]:
    """A record's stored headers as a dict ({} when unreadable)."""
    try:
        return stored_headers(record)
    except RetryRefused:
        return {}


def stored_headers(record: FailedMessage) -> dict[str, str]:
    """A record's stored headers; RetryRefused when they cannot be read."""
    try:
        value = json.loads(record.headers or "{}")
    except ValueError as exc:
        raise RetryRefused(f"stored headers are not JSON: {exc}") from None
    except RecursionError:
        raise RetryRefused("stored headers nest JSON too deeply to read") from None
    if not isinstance(value, dict):
        raise RetryRefused("stored headers are not a JSON object")
    return value


def message_part(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers without the failure description and retry counters."""
    return {k: v for k, v in headers.items() if k not in FAILURE_HEADERS and not k.startswith(EXCEPTION_INFO_PREFIX)}


def in_queue(qs: QuerySet, queue: str | None) -> QuerySet:
    """The records of ``qs`` that failed in ``queue`` (None: any queue).  ``FailedQ`` may
    carry an endpoint's ``@machine`` suffix (NServiceBus's address form)."""
    if queue is None:
        return qs
    return qs.filter(Q(original_queue=queue) | Q(original_queue__startswith=queue + "@"))
