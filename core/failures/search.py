"""Looking at failed messages: groups and search (the CLI's `failed groups|list`, the dashboard)."""
from __future__ import annotations

import datetime as dt
from typing import Iterable, NamedTuple

from django.db.models import Count, Max, Q, QuerySet

from core.conf import get_settings
from core.failures.records import base
from core.models import FailureStatus


class FailureGroup(NamedTuple):
    group_key: str
    title: str
    count: int
    last_failed: dt.datetime
    exception_type: str


def groups(by: str = "exception", status: str = FailureStatus.UNRESOLVED, using: str | None = None,
           queue: str | None = None, message_type: str | None = None) -> list[FailureGroup]:
    """Groups of (by default unresolved) records, largest first.  ``by``: "exception" (type +
    first stack frame; the key is ``group_key``), "message_type" or "queue" (the key is the
    type / queue name, and exception_type is "")."""
    using = using or get_settings().DATABASE
    qs = base(using).filter(status=status)
    if queue:
        qs = qs.filter(original_queue=queue)
    if message_type:
        qs = qs.filter(message_type=message_type)
    if by == "exception":
        rows = qs.values("group_key", "group_title", "exception_type").annotate(
            n=Count("pk"), last=Max("time_of_failure")).order_by("-n", "-last")
        return [FailureGroup(r["group_key"], r["group_title"], r["n"], r["last"], r["exception_type"])
                for r in rows]
    field = {"message_type": "message_type", "queue": "original_queue"}.get(by)
    if field is None:
        raise ValueError('groups(by=...) must be "exception", "message_type" or "queue"')
    rows = qs.values(field).annotate(n=Count("pk"), last=Max("time_of_failure")).order_by("-n", "-last")
    return [FailureGroup(r[field], r[field] or "(none)", r["n"], r["last"], "") for r in rows]


def search(text: str | None = None, exception: str | None = None, message_id: str | None = None,
           queue: str | None = None, message_type: str | None = None, status: str | Iterable[str] | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, group: str | None = None,
           using: str | None = None) -> QuerySet:
    """Failed-message records matching every given filter, newest failure first.

    ``text`` looks (case-insensitively) in the message id, exception type and message, message
    type and queue; ``exception`` in the exception type; ``message_id`` is exact;
    ``since`` / ``until`` bound time_of_failure (inclusive / exclusive)."""
    using = using or get_settings().DATABASE
    qs = base(using).all()
    if text:
        qs = qs.filter(Q(message_id__icontains=text) | Q(exception_type__icontains=text)
                       | Q(exception_message__icontains=text) | Q(message_type__icontains=text)
                       | Q(original_queue__icontains=text))
    if status:
        qs = qs.filter(status=status) if isinstance(status, str) else qs.filter(status__in=list(status))
    lookups = {"exception_type__icontains": exception, "message_id": message_id, "original_queue": queue,
               "message_type": message_type, "group_key": group, "time_of_failure__gte": since,
               "time_of_failure__lt": until}
    return qs.filter(**{lookup: value for lookup, value in lookups.items() if value}).order_by(
        "-time_of_failure", "-pk")
