"""The pipeline's metric windows in the monitoring tab: times older than a queue's oldest
record still in the database come from them, in the same points (core.monitoring)."""
from __future__ import annotations

from collections import defaultdict

from django.db import connections
from django.db.models import F, Max, Q, Sum

from core.conf import get_settings
from core.dialects import dialect_for
from core.monitoring_period import US, Period, QueueSeries, micros, when
from core.records.models import MetricWindow, ProcessingRecord


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
    weighted = {}
    for name in WINDOW_PERCENTILES:
        weighted[f"{name}_sum"] = Sum(F(name) * F("messages"))
        weighted[f"{name}_n"] = Sum("messages", filter=Q(**{f"{name}__isnull": False}))
    using = get_settings().DATABASE
    names = ["queue", "window_start", "n", "r", "f", *weighted]
    query = (MetricWindow.objects.using(using)
             .filter(queue__in=list(until), window_seconds=unit, window_start__gte=when(period.start_us),
                     window_start__lt=when(min(max(until.values()), period.end_us)))
             .order_by().values("queue", "window_start")
             .annotate(n=Sum("messages"), r=Sum("retries"), f=Sum("failures"), **weighted).values_list(*names))
    # Run as the ORM wrote it but read raw: Django's per-value converters cost more than the
    # statement for a month of hours (the times are converted once each, below).
    sql, params = query.query.sql_with_params()
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = [dict(zip(names, row)) for row in cursor.fetchall()]
    d = dialect_for(connections[using], get_settings().SCHEMA)
    # (queue, bucket index) → percentile column → [Σ value × messages, Σ messages]
    weights: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(
        lambda: {name: [0.0, 0] for name in WINDOW_PERCENTILES})
    for w in rows:
        start = micros(d.to_datetime(w["window_start"]))
        s = series[w["queue"]]
        index = (start - period.start_us) // period.bucket_us
        if start >= until[w["queue"]] or not 0 <= index < len(s.buckets):
            continue
        b = s.buckets[index]
        b.from_windows = True
        b.records += int(w["n"])
        b.retried += int(w["r"])
        b.failures += int(w["f"])
        for name, pair in weights[(w["queue"], index)].items():
            if w[f"{name}_n"]:
                pair[0] += float(w[f"{name}_sum"])
                pair[1] += int(w[f"{name}_n"])
    for (queue, index), columns in weights.items():
        b = series[queue].buckets[index]
        b.processing_sum_ms += columns["processing_ms_p50"][0]
        b.processing_n += int(columns["processing_ms_p50"][1])
        b.critical_sum_ms += columns["critical_ms_p50"][0]
        b.critical_n += int(columns["critical_ms_p50"][1])
        for kind in ("processing", "critical"):
            for p in (50, 95, 99):
                total, n = columns[f"{kind}_ms_p{p}"]
                if getattr(b, f"{kind}_ms").get(p) is None and n:
                    getattr(b, f"{kind}_ms")[p] = total / n
