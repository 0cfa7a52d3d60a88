"""The failed-message group counts (core.models.FailedGroup) checked against a count of the
records themselves: what the triggers keep must be what grouping every record would say."""
from __future__ import annotations

from django.db.models import Count, Max, Min

from core.models import FailedGroup, FailedMessage


def counted_from_records() -> dict[tuple[str, str], tuple[int, object, object]]:
    rows = (FailedMessage.objects.order_by().values("status", "group_key")
            .annotate(n=Count("pk"), first=Min("time_of_failure"), last=Max("time_of_failure")))
    return {(r["status"], r["group_key"]): (r["n"], r["first"], r["last"]) for r in rows}


def kept() -> dict[tuple[str, str], tuple[int, object, object]]:
    return {(g.status, g.group_key): (g.records, g.first_failed, g.last_failed)
            for g in FailedGroup.objects.filter(records__gt=0)}


def assert_group_counts_kept() -> None:
    assert kept() == counted_from_records()
    # A group with no records left in a status keeps its row, with no times.
    assert not FailedGroup.objects.filter(records__lt=0).exists()
    assert not FailedGroup.objects.filter(records=0, last_failed__isnull=False).exists()
