"""The pipeline's metric windows in the monitoring tab: times older than a queue's oldest
record still in the database come from them, in the same points (core.monitoring.live)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict

from django.db import connections
from django.db.models import Case, F, FloatField, IntegerField, Max, Min, OuterRef, Q, Subquery, Sum, Value, When
from django.db.models.functions import Cast

from core.conf import get_settings
from core.monitoring.period import US, Period, QueueSeries, micros, when
from core.models import QueueRecord
from core.models.monitoring import WINDOWS_LOADED, RollupMark
from core.models.records import MetricWindow, ProcessingRecord


def records_from(queues: list[str], period: Period) -> dict[str, int]:
    """Per queue, from when the records are used: where the pipeline's windows end, or the
    whole minute/hour after the queue's oldest record if the windows reach past it."""
    using = get_settings().DATABASE
    unit = 3600 if period.bucket_seconds % 3600 == 0 else 60
    # One statement, two index lookups per queue (its newest window, its oldest record) as
    # subqueries of its registry row: a MAX or MIN over every queue's rows would read them all.
    newest_window = (MetricWindow.objects.using(using).filter(queue=OuterRef("name"), window_seconds=unit)
                     .order_by("-window_start").values("window_start")[:1])
    oldest_record = (ProcessingRecord.objects.using(using).filter(queue=OuterRef("name")).order_by("ended_us")
                     .values("ended_us")[:1])
    ends = (QueueRecord.objects.using(using).filter(name__in=queues)
            .annotate(last=Subquery(newest_window), oldest=Subquery(oldest_record))
            .values_list("name", "last", "oldest"))
    found: dict[str, int] = {}
    for queue, last, oldest in ends:
        if last is None or oldest is not None and oldest <= period.start_us:  # no windows, or records cover it
            continue
        windows_end = micros(last) + unit * US
        oldest_whole = -(-(oldest if oldest is not None else windows_end) // (unit * US)) * unit * US
        found[queue] = min(windows_end, oldest_whole)
    return found


#: The windows' percentile columns (p50 also stands in for the average: windows keep no mean).
WINDOW_PERCENTILES = [f"{kind}_ms_p{p}" for kind in ("processing", "critical") for p in (50, 95, 99)]


#: A range's window rows are kept this long per process: the windows change when the
#: pipeline loads a run (which stamps RollupMark WINDOWS_LOADED: part of the key, with the
#: windows' lowest and highest id for windows written otherwise), and a range over days read
#: them all again on every view (the bulk of its time).
WINDOW_CACHE_SECONDS = 60.0
WINDOW_CACHE_SIZE = 16
_window_cache: dict[tuple, tuple[float, list[tuple]]] = {}
_window_cache_lock = threading.Lock()


def forget_windows() -> None:
    with _window_cache_lock:
        _window_cache.clear()


def window_rows(period: Period, until: dict[str, int]) -> list[tuple]:
    """(queue, bucket index, messages, retries, failures, then Σ value × messages and Σ
    messages per percentile column) per queue and bucket, from :data:`_window_cache` while
    the windows are the same ones and younger than :data:`WINDOW_CACHE_SECONDS`."""
    using = get_settings().DATABASE
    ids = MetricWindow.objects.using(using).aggregate(low=Min("id"), high=Max("id"))
    loaded = RollupMark.objects.using(using).filter(name=WINDOWS_LOADED).values_list("until_us", flat=True).first()
    key = (using, period.start_us, period.end_us, period.bucket_us, tuple(sorted(until.items())),
           ids["low"], ids["high"], loaded)
    now = time.monotonic()
    with _window_cache_lock:
        kept = _window_cache.get(key)
        if kept is not None and now - kept[0] < WINDOW_CACHE_SECONDS:
            return kept[1]
    rows = _read_window_rows(period, until, using)
    with _window_cache_lock:
        for stale in [k for k, (at, _) in _window_cache.items() if now - at >= WINDOW_CACHE_SECONDS]:
            del _window_cache[stale]
        while len(_window_cache) >= WINDOW_CACHE_SIZE:
            del _window_cache[next(iter(_window_cache))]  # the oldest entry
        _window_cache[key] = (now, rows)
    return rows


def _read_window_rows(period: Period, until: dict[str, int], using: str) -> list[tuple]:
    unit = 3600 if period.bucket_seconds % 3600 == 0 else 60
    # Sums as floats in the statement: a bigint SUM would come back as a decimal per value.
    weighted = {"n": Cast(Sum("messages"), FloatField()), "r": Cast(Sum("retries"), FloatField()),
                "f": Cast(Sum("failures"), FloatField())}
    for name in WINDOW_PERCENTILES:
        weighted[f"{name}_sum"] = Cast(Sum(F(name) * F("messages")), FloatField())
        weighted[f"{name}_n"] = Cast(Sum("messages", filter=Q(**{f"{name}__isnull": False})), FloatField())
    # Each window's bucket in the statement (a CASE over the bucket edges: at most BUCKETS + 1
    # of them), so a month of hours comes back as a row per queue and bucket, with no
    # timestamps to convert; a queue's windows stop where its records take over.
    bucket = Case(*[When(window_start__lt=when(period.start_us + (i + 1) * period.bucket_us), then=Value(i))
                    for i in range(period.buckets)], default=Value(period.buckets), output_field=IntegerField())
    ends: dict[int, list[str]] = defaultdict(list)
    for queue, end in until.items():
        ends[min(end, period.end_us)].append(queue)
    before_records = Q()
    for end, queues in ends.items():
        before_records |= Q(queue__in=queues, window_start__lt=when(end))
    query = (MetricWindow.objects.using(using)
             .filter(before_records, window_seconds=unit, window_start__gte=when(period.start_us))
             .annotate(bucket=bucket).order_by().values("queue", "bucket").annotate(**weighted)
             .values_list("queue", "bucket", *weighted))
    # Run as the ORM wrote it but read raw: Django's per-value converters would cost more
    # than the statement.
    sql, params = query.query.sql_with_params()
    with connections[query.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def add_windows(series: dict[str, QueueSeries], period: Period, until: dict[str, int]) -> None:
    """Each queue's buckets before its ``until`` (µs) from the pipeline's windows: one
    statement summing each queue's hour (or minute) over its message types, percentiles
    weighted by messages."""
    rows = window_rows(period, until)
    # A row per queue and bucket (the statement groups by both): its figures go straight in.
    columns = [(kind, int(p)) for kind, p in (name.split("_ms_p") for name in WINDOW_PERCENTILES)]
    for queue, index, n, retried, failures, *sums in rows:
        buckets = series[queue].buckets
        if not 0 <= index < len(buckets):
            continue
        b = buckets[index]
        b.from_windows = True
        b.records += int(n or 0)
        b.retried += int(retried or 0)
        b.failures += int(failures or 0)
        for (kind, p), total, weight in zip(columns, sums[0::2], sums[1::2]):
            total, weight = total or 0.0, int(weight or 0)
            if p == 50:  # the median stands in for the average: windows keep no mean
                if kind == "processing":
                    b.processing_sum_ms += total
                    b.processing_n += weight
                else:
                    b.critical_sum_ms += total
                    b.critical_n += weight
            shown = b.processing_ms if kind == "processing" else b.critical_ms
            if weight and shown.get(p) is None:
                shown[p] = total / weight
