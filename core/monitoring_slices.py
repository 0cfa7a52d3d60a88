"""One queue's records of a monitoring period by message type or by worker (the tab's
drill-down): exact counts over the period, percentiles from its newest records."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, QuerySet

from core.conf import get_settings
from core.monitoring import DETAIL_SAMPLE, US, Period, percentiles, times_of
from core.records.models import ProcessingRecord
from pipeline import schema

#: The most slices a breakdown lists (the busiest).
BREAKDOWN_LIMIT = 50


@dataclass
class Slice:
    key: str
    records: int
    retried: int
    failures: int
    throughput_per_s: float
    processing_ms: dict[int, float | None]
    critical_ms: dict[int, float | None]
    skewed: int = 0


BREAKDOWNS = ("message_type", "worker")


def breakdown_query(queue: str, period: Period, by: str) -> QuerySet:
    """(message type or worker, outcome, records) of the queue's records in the period: one
    index range on (queue, ended_us)."""
    return (ProcessingRecord.objects.using(get_settings().DATABASE)
            .filter(queue=queue, ended_us__gte=period.start_us, ended_us__lt=period.end_us)
            .order_by().values_list(by, "outcome").annotate(n=Count("pk")))


def breakdown(queue: str, period: Period, by: str, sample: int = DETAIL_SAMPLE) -> list[Slice]:
    """The queue's records of the period per message type or worker (the busiest
    :data:`BREAKDOWN_LIMIT`): exact counts over the period, percentiles from its newest
    ``sample`` records."""
    if by not in BREAKDOWNS:
        raise ValueError(f"by must be one of {', '.join(BREAKDOWNS)}, not {by[:20]!r}")
    records = ProcessingRecord.objects.using(get_settings().DATABASE).filter(
        queue=queue, ended_us__gte=period.start_us, ended_us__lt=period.end_us)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for key, outcome, n in breakdown_query(queue, period, by):
        c = counts[key or ""]
        c[0] += n
        c[1] += n if outcome == schema.RETRIED else 0
        c[2] += n if outcome in schema.FAILURES else 0
    rows: dict[str, list[tuple]] = defaultdict(list)
    for key, *row in records.order_by("-ended_us").values_list(
            by, "ended_us", "started_us", "time_sent_us", "deliver_at_us", "outcome")[:sample]:
        rows[key or ""].append(tuple(row))
    elapsed = max(1.0, (min(period.end_us, period.now_us) - period.start_us) / US)
    slices = []
    for key, (n, retried, failures) in sorted(counts.items(), key=lambda kv: -kv[1][0])[:BREAKDOWN_LIMIT]:
        processing, critical, skewed = times_of(rows.get(key, []))
        slices.append(Slice(key, n, retried, failures, n / elapsed, percentiles(processing), percentiles(critical),
                            skewed))
    return slices
