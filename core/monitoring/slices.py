"""One queue's records of a monitoring period by message type or by worker (the tab's
drill-down): exact counts over the period, percentiles from its newest records."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, QuerySet

from core.conf import get_settings
from core.monitoring.live import US, Period, percentiles, times_of
from core.models.records import ProcessingRecord
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


def breakdown_query(queue: str, period: Period) -> QuerySet:
    """(message type, worker, outcome, records) of the queue's records in the period: one
    index range on ended_us for both breakdowns."""
    return (ProcessingRecord.objects.using(get_settings().DATABASE)
            .filter(queue=queue, ended_us__gte=period.start_us, ended_us__lt=period.end_us)
            .order_by().values_list("message_type", "worker", "outcome").annotate(n=Count("pk")))


def breakdowns(queue: str, period: Period, newest: list[tuple]) -> dict[str, list[Slice]]:
    """The queue's records of the period per message type and per worker (the busiest
    :data:`BREAKDOWN_LIMIT` of each): exact counts over the period, percentiles from
    ``newest`` (the rows of :func:`core.monitoring.live.sample_query`, which end with the message
    type and the worker)."""
    counts: dict[str, dict[str, list[int]]] = {by: defaultdict(lambda: [0, 0, 0]) for by in BREAKDOWNS}
    for message_type, worker, outcome, n in breakdown_query(queue, period):
        for by, key in (("message_type", message_type), ("worker", worker)):
            c = counts[by][key or ""]
            c[0] += n
            c[1] += n if outcome == schema.RETRIED else 0
            c[2] += n if outcome in schema.FAILURES else 0
    elapsed = max(1.0, (min(period.end_us, period.now_us) - period.start_us) / US)
    found: dict[str, list[Slice]] = {}
    for position, by in enumerate(BREAKDOWNS):
        rows: dict[str, list[tuple]] = defaultdict(list)
        for row in newest:
            rows[row[5 + position] or ""].append(row)
        found[by] = []
        for key, (n, retried, failures) in sorted(counts[by].items(), key=lambda kv: -kv[1][0])[:BREAKDOWN_LIMIT]:
            processing, critical, skewed = times_of(rows.get(key, []))
            found[by].append(Slice(key, n, retried, failures, n / elapsed, percentiles(processing),
                                   percentiles(critical), skewed))
    return found
