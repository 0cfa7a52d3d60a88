"""The pipeline's metric windows in the monitoring tab: times older than a queue's oldest
record still in the database come from them, in the same points (core.monitoring.live)."""
from __future__ import annotations

from collections import defaultdict

from django.db import connections
from django.db.models import F, FloatField, Max, Q, Sum
from django.db.models.functions import Cast

from core.conf import get_settings
from core.dialects import dialect_for
from core.monitoring.period import US, Period, QueueSeries, micros, when
from core.models.records import MetricWindow, ProcessingRecord


def records_from(queues: list[str], period: Period) -> dict[str, int]:
    """Per queue, from when the records are used: where the pipeline's windows end, or the
    whole minute/hour after the queue's oldest record if the windows reach past it."""
    using = get_settings().DATABASE
    unit = 3600 if period.bucket_seconds % 3600 == 0 else 60
    newest = dict(MetricWindow.objects.using(using).filter(queue__in=queues, window_seconds=unit)
                  .order_by().values("queue").annotate(last=Max("window_start")).values_list("queue", "last"))
    found: dict[str, int] = {}
    for queue, last in newest.items():
        # An index lookup per queue with windows: a MIN over every queue's records would read them all.
        oldest = (ProcessingRecord.objects.using(using).filter(queue=queue).order_by("ended_us")
                  .values_list("ended_us", flat=True).first())
        if oldest is not None and oldest <= period.start_us:
            continue
        windows_end = micros(last) + unit * US
        oldest_whole = -(-(oldest if oldest is not None else windows_end) // (unit * US)) * unit * US
        found[queue] = min(windows_end, oldest_whole)
    return found


#: The windows' percentile columns (p50 also stands in for the average: windows keep no mean).
WINDOW_PERCENTILES = [f"{kind}_ms_p{p}" for kind in ("processing", "critical") for p in (50, 95, 99)]


def add_windows(series: dict[str, QueueSeries], period: Period, until: dict[str, int]) -> None:
    """Each queue's buckets before its ``until`` (µs) from the pipeline's windows: one
    statement summing each queue's hour (or minute) over its message types, percentiles
    weighted by messages."""
    unit = 3600 if period.bucket_seconds % 3600 == 0 else 60
    # Sums as floats in the statement: a bigint SUM would come back as a decimal per value.
    weighted = {"n": Cast(Sum("messages"), FloatField()), "r": Cast(Sum("retries"), FloatField()),
                "f": Cast(Sum("failures"), FloatField())}
    for name in WINDOW_PERCENTILES:
        weighted[f"{name}_sum"] = Cast(Sum(F(name) * F("messages")), FloatField())
        weighted[f"{name}_n"] = Cast(Sum("messages", filter=Q(**{f"{name}__isnull": False})), FloatField())
    using = get_settings().DATABASE
    query = (MetricWindow.objects.using(using)
             .filter(queue__in=list(until), window_seconds=unit, window_start__gte=when(period.start_us),
                     window_start__lt=when(min(max(until.values()), period.end_us)))
             .order_by().values("queue", "window_start").annotate(**weighted)
             .values_list("queue", "window_start", *weighted))
    # Run as the ORM wrote it but read raw: Django's per-value converters cost more than the
    # statement for a month of hours (the times are converted once each, below).
    sql, params = query.query.sql_with_params()
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    d = dialect_for(connections[using], get_settings().SCHEMA)
    # (queue, bucket index) → [Σ value × messages, Σ messages] per percentile column, in order
    weights: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0] * (2 * len(WINDOW_PERCENTILES)))
    for queue, window_start, n, retried, failures, *sums in rows:
        start = micros(d.to_datetime(window_start))
        s = series[queue]
        index = (start - period.start_us) // period.bucket_us
        if start >= until[queue] or not 0 <= index < len(s.buckets):
            continue
        b = s.buckets[index]
        b.from_windows = True
        b.records += int(n or 0)
        b.retried += int(retried or 0)
        b.failures += int(failures or 0)
        totals = weights[(queue, index)]
        for i, value in enumerate(sums):
            totals[i] += value or 0.0
    for (queue, index), totals in weights.items():
        b = series[queue].buckets[index]
        for i, name in enumerate(WINDOW_PERCENTILES):
            total, n = totals[2 * i], totals[2 * i + 1]
            kind, p = name.split("_ms_p")
            if p == "50":  # the median stands in for the average: windows keep no mean
                setattr(b, f"{kind}_sum_ms", getattr(b, f"{kind}_sum_ms") + total)
                setattr(b, f"{kind}_n", getattr(b, f"{kind}_n") + int(n))
            if n and getattr(b, f"{kind}_ms").get(int(p)) is None:
                getattr(b, f"{kind}_ms")[int(p)] = total / n
