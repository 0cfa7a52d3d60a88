"""Looking at failed messages: groups and search (the CLI's `failed groups|list`, the dashboard)."""
from __future__ import annotations

import datetime as dt
from typing import Iterable, NamedTuple

from django.db import connections
from django.db.models import Count, Max, Min, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL

from core.conf import get_settings
from core.dialects import dialect_for
from core.failures.records import MAX_IN, base, chunks
from core.models import FailedGroup, FailureStatus


class FailureGroup(NamedTuple):
    group_key: str
    title: str
    count: int
    last_failed: dt.datetime
    exception_type: str
    first_failed: dt.datetime | None = None


def groups(by: str = "exception", status: str = FailureStatus.UNRESOLVED, using: str | None = None,
           queue: str | None = None, message_type: str | None = None, limit: int | None = None) -> list[FailureGroup]:
    """Groups of (by default unresolved) records, largest first.  ``by``: "exception" (type +
    first stack frame; the key is ``group_key``), "message_type" or "queue" (the key is the
    type / queue name, and exception_type is "").  ``limit``: only the largest that many, cut
    in SQL (titles are then looked up for those alone: 100,000 groups are not all read)."""
    using = using or get_settings().DATABASE
    if by == "exception" and not queue and not message_type:
        # Every group of the status: their counts are kept per group (core.models.FailedGroup),
        # read largest first in index order.
        kept = (FailedGroup.objects.using(using).filter(status=status, records__gt=0)
                .order_by("-records", "-last_failed")[:limit])
        return [FailureGroup(g.group_key, g.title, g.records, g.last_failed, g.exception_type,
                             g.first_failed) for g in kept]
    qs = base(using).filter(status=status)
    if queue:
        qs = qs.filter(original_queue=queue)
    if message_type:
        qs = qs.filter(message_type=message_type)
    if by == "exception":  # within a queue or a message type: counted from the records
        # Counted by key alone from index sluice_fm_status_groups; each group's title and
        # exception type come from one of its rows (the key is a hash of both), fetched by id.
        rows = list(qs.order_by().values("group_key").annotate(
            n=Count("pk"), first=Min("time_of_failure"), last=Max("time_of_failure"), one=Max("pk"))
            .order_by("-n", "-last")[:limit])
        titles: dict[int, tuple[str, str]] = {}
        for chunk in chunks([r["one"] for r in rows], MAX_IN):
            for pk, title, exception_type in base(using).filter(pk__in=chunk).values_list(
                    "pk", "group_title", "exception_type"):
                titles[pk] = (title, exception_type)
        return [FailureGroup(r["group_key"], titles.get(r["one"], (r["group_key"],))[0], r["n"], r["last"],
                             titles.get(r["one"], ("", ""))[1], r["first"]) for r in rows]
    field = {"message_type": "message_type", "queue": "original_queue"}.get(by)
    if field is None:
        raise ValueError('groups(by=...) must be "exception", "message_type" or "queue"')
    rows = qs.order_by().values(field).annotate(n=Count("pk"), first=Min("time_of_failure"),
                                                last=Max("time_of_failure")).order_by("-n", "-last")[:limit]
    return [FailureGroup(r[field], r[field] or "(none)", r["n"], r["last"], "", r["first"]) for r in rows]


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
    haystack = dialect_for(connections[using]).failed_search_expression() if text else None
    if text and haystack:  # one indexed expression (PostgreSQL: trigram index sluice_fm_search)
        qs = qs.alias(haystack=RawSQL(haystack, [], output_field=TextField())).filter(
            haystack__contains=text.upper())
    elif text:
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
