"""The failed-message counts the database keeps (core.models.FailedGroup and FailedQueueCount)
checked against a count of the records themselves: what the triggers keep must be what
grouping every record would say."""
from __future__ import annotations

from django.db.models import Count, Max, Min

from core.models import FailedGroup, FailedMessage, FailedQueueCount


def counted_from_records() -> dict[tuple[str, str], tuple[int, object, object]]:
    rows = (FailedMessage.objects.order_by().values("status", "group_key")
            .annotate(n=Count("pk"), first=Min("time_of_failure"), last=Max("time_of_failure")))
    return {(r["status"], r["group_key"]): (r["n"], r["first"], r["last"]) for r in rows}


def kept() -> dict[tuple[str, str], tuple[int, object, object]]:
    return {(g.status, g.group_key): (g.records, g.first_failed, g.last_failed)
            for g in FailedGroup.objects.filter(records__gt=0)}


def queues_from_records() -> dict[tuple[str, str], int]:
    rows = FailedMessage.objects.order_by().values("status", "original_queue").annotate(n=Count("pk"))
    return {(r["status"], r["original_queue"]): r["n"] for r in rows}


def kept_by_queue() -> dict[tuple[str, str], int]:
    return {(c.status, c.queue): c.records for c in FailedQueueCount.objects.filter(records__gt=0)}


def assert_failed_counts_kept() -> None:
    assert kept() == counted_from_records()
    assert kept_by_queue() == queues_from_records()
    # A group or queue with no records left in a status keeps its row, at zero (a group without times).
    assert not FailedGroup.objects.filter(records__lt=0).exists()
    assert not FailedQueueCount.objects.filter(records__lt=0).exists()
    assert not FailedGroup.objects.filter(records=0, last_failed__isnull=False).exists()
