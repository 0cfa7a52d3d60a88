"""What the live monitoring tab shows, per queue and period: throughput, retries, failures,
processing and critical time (p50/p95/p99) and queue length, bucketed for sparklines;
the same queue by message type and by worker (core.monitoring.slices); workers whose
heartbeat is stale or whose clock disagrees with the database's (core.monitoring.workers).
A sibling of :mod:`core.monitoring.measurements` (which alert rules read), built on the same tables
and the same bounded reads; periods and buckets are in core.monitoring.period.

Where the figures come from, so that a chart has no seam:

- recent times from the processing records, on an ended_us index: counts, processing and
  critical time sums (so averages) per bucket and outcome for every queue in one grouped
  statement; for one queue's page also the newest :data:`DETAIL_SAMPLE` records of the
  period for p50/p95/p99 (a read that stops there however busy the queue: ``sampled`` <
  ``records`` says so);
- whole minutes that ended more than two minutes ago from their sums per queue and minute
  (``sluice_queue_minute``, rolled up by core.monitoring.queue_samples' loop), and, where
  the buckets are whole hours (a range of days), whole hours of those minutes from their
  sums per queue and hour (``sluice_queue_hour``): an hour or a range reads a row per queue
  and minute or hour, not every record;
- times older than a queue's oldest record still in the database (exported and deleted
  after SLUICE_RECORDS_RETENTION) from the pipeline's metric windows (one minute or one
  hour, whichever divides the bucket), up to where the windows end;
- queue length from the queue samples (core.monitoring.queue_samples), the last sample of each bucket.

Critical time is NServiceBus's: ProcessingEnded − (DeliverAt ?? TimeSent).  A record
that ended before it was sent (the sender's clock ahead of the worker's) is counted as
``skewed`` and left out of the percentiles, not drawn as a negative time.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from django.db import connections
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce

from core.conf import get_settings
from core.models.monitoring import GRAINS, SUMS, QueueHour, QueueMinute, QueueSample, RollupMark
from core.monitoring.period import (  # noqa: F401 — the monitoring API in one place
    BUCKETS, MAX_RANGE, PERIODS, US, Bucket, Period, QueueSeries, make_period, micros, percentiles, when,
)
from core.monitoring.windows import add_windows, records_from as windows_records_from
from core.models.records import ProcessingRecord
from pipeline import schema

#: Newest records of a queue its page's percentiles are computed from.
DETAIL_SAMPLE = 5000


def _bucket_of(period: Period):
    return ExpressionWrapper((F("ended_us") - Value(period.start_us)) / Value(period.bucket_us),
                             output_field=BigIntegerField())


def queue_series(queues: list[str], period: Period, sample: int = 0) -> dict[str, QueueSeries]:
    """Each queue's buckets and period figures (see the module doc); percentiles only with a
    ``sample`` (one read per queue: a queue's page asks, the overview of every queue does not)."""
    series = {q: QueueSeries(q, [Bucket(t) for t in period.bucket_starts()]) for q in queues}
    records_from = windows_records_from(queues, period) if not period.live or period.name == "range" else {}
    # Counts: one statement for the queues whose records cover the period (an index range per
    # queue on (queue, ended_us)), one for each queue whose older part comes from windows.
    groups: dict[int, list[str]] = defaultdict(list)
    for queue in queues:
        groups[max(period.start_us, records_from.get(queue, 0))].append(queue)
    minutes_until, hours_until = _rolled_up_until(period)
    for since, group in groups.items():
        # Whole minutes already summed (core.monitoring.queue_samples) come from the minutes,
        # whole hours of them from the hours where the buckets are whole hours, the rest
        # from the records.
        minutes_end = min(max(minutes_until, since), period.end_us)
        for model, start, end in _summed_spans(since, minutes_end, hours_until):
            for queue, index, *sums in fetch(minutes_query(group, start, end, period, model)):
                if 0 <= index < len(series[queue].buckets):
                    _add_minutes(series[queue].buckets[index], *sums)
        for queue, index, outcome, *sums in fetch(counts_query(group, max(since, minutes_end), period)):
            if 0 <= index < len(series[queue].buckets):
                _count(series[queue].buckets[index], outcome, *sums)
    for queue in queues:
        s = series[queue]
        if sample:
            rows = list(sample_query(queue, max(period.start_us, records_from.get(queue, 0)), period, sample))
            _percentiles_from_records(s, rows, period)
    if records_from:
        add_windows(series, period, records_from)
    _fill_lengths(series, period)
    seconds = _bucket_seconds(period)
    for s in series.values():
        _totals(s, period, seconds)
    return series


def fetch(query: QuerySet) -> list[tuple]:
    """A grouped query's rows as the database returns them: integers and sums need none of
    the ORM's per-value converters, which cost more than the statement for 50 queues."""
    sql, params = query.query.sql_with_params()
    with connections[query.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def counts_query(queues: list[str] | None, since_us: int, period: Period) -> QuerySet:
    """(queue, bucket index, outcome, records, processing µs sum, critical records, critical µs
    sum, skewed records) of the queues' records from ``since_us`` to the period's end: an index
    range on ended_us, every record counted, nothing read twice."""
    origin = Coalesce(F("deliver_at_us"), F("time_sent_us"))
    timed = Q(outcome=schema.PROCESSED, deliver_at_us__isnull=False) | Q(outcome=schema.PROCESSED,
                                                                          time_sent_us__isnull=False)
    on_time = timed & Q(ended_us__gte=origin)
    records = ProcessingRecord.objects.using(get_settings().DATABASE).filter(
        ended_us__gte=since_us, ended_us__lt=period.end_us)
    if queues is not None:  # None: every queue (the minutes' roll-up)
        records = records.filter(queue__in=queues)
    return (records.annotate(bucket=_bucket_of(period)).order_by()
            .values_list("queue", "bucket", "outcome")
            .annotate(n=Count("pk"),
                      processing=Sum(F("ended_us") - F("started_us"), filter=Q(outcome__in=schema.HANDLER_RAN)),
                      critical_n=Count("pk", filter=on_time),
                      critical=Sum(F("ended_us") - origin, filter=on_time),
                      skewed=Count("pk", filter=(Q(deliver_at_us__isnull=False) | Q(time_sent_us__isnull=False))
                                   & Q(ended_us__lt=origin))))


def minutes_query(queues: list[str], since_us: int, until_us: int, period: Period,
                  model: type[QueueMinute] | type[QueueHour] = QueueMinute) -> QuerySet:
    """(queue, bucket index, records, retried, failures, processing µs, processing n, critical µs,
    critical n, skewed) of the queues' rolled-up minutes (or hours, ``model``) from
    ``since_us`` to ``until_us``."""
    at = "hour_us" if model is QueueHour else "minute_us"
    return (model.objects.using(get_settings().DATABASE)
            .filter(queue__in=queues, **{f"{at}__gte": since_us, f"{at}__lt": until_us})
            .annotate(bucket=ExpressionWrapper((F(at) - Value(period.start_us)) / Value(period.bucket_us),
                                               output_field=BigIntegerField()))
            .order_by().values_list("queue", "bucket").annotate(*(Sum(name) for name in SUMS)))


def _rolled_up_until(period: Period) -> tuple[int, int]:
    """Up to when the minutes and the hours hold the records (0: none, or the buckets are
    not whole minutes / whole hours)."""
    if period.bucket_seconds % 60:
        return 0, 0
    marks = dict(RollupMark.objects.using(get_settings().DATABASE)
                 .filter(name__in=["queue-minutes", "queue-hours"]).values_list("name", "until_us"))
    hours = marks.get("queue-hours", 0) if period.bucket_seconds % 3600 == 0 else 0
    return marks.get("queue-minutes", 0), hours


def _summed_spans(since_us: int, minutes_end: int, hours_until: int) -> list[tuple[type, int, int]]:
    """Which summed table covers which part of ``since_us`` to ``minutes_end``: the whole
    hours rolled up from the hours, the minutes on either side of them from the minutes."""
    hour = 3600 * US
    first = -(-since_us // hour) * hour
    last = min(hours_until, minutes_end) // hour * hour
    if last <= first:
        return [(QueueMinute, since_us, minutes_end)] if minutes_end > since_us else []
    spans = [(QueueMinute, since_us, first), (QueueHour, first, last), (QueueMinute, last, minutes_end)]
    return [(model, start, end) for model, start, end in spans if end > start]


def _add_minutes(b: Bucket, records: Any, retried: Any, failures: Any, processing_us: Any, processing_n: Any,
                 critical_us: Any, critical_n: Any, skewed: Any) -> None:
    b.records += int(records)
    b.retried += int(retried)
    b.failures += int(failures)
    b.processing_sum_ms += float(processing_us) / 1000
    b.processing_n += int(processing_n)
    b.critical_sum_ms += float(critical_us) / 1000
    b.critical_n += int(critical_n)
    b.skewed += int(skewed)


def sample_query(queue: str, since_us: int, period: Period, limit: int) -> QuerySet:
    """The queue's newest ``limit`` records from ``since_us`` to the period's end (their
    times, outcome, message type and worker): an index read backwards, stopping at ``limit``."""
    return (ProcessingRecord.objects.using(get_settings().DATABASE)
            .filter(queue=queue, ended_us__gte=since_us, ended_us__lt=period.end_us)
            .order_by("-ended_us")
            .values_list("ended_us", "started_us", "time_sent_us", "deliver_at_us", "outcome", "message_type",
                         "worker")[:limit])


def lengths_query(queues: list[str], period: Period) -> QuerySet:
    """The queues' length samples in the period, on an index range: every sample for short
    buckets, for long ones only those that begin a step at least a tenth of a bucket long
    (a few per bucket however long the period)."""
    samples = (QueueSample.objects.using(get_settings().DATABASE)
               .filter(queue__in=queues, at_us__gte=period.start_us, at_us__lt=period.end_us))
    grains = _grains(period)
    if grains != [0, *range(1, len(GRAINS) + 1)]:
        samples = samples.filter(grain__in=grains)
    return samples.order_by("queue", "at_us").values_list("queue", "at_us", "length", "estimated")


def _grains(period: Period) -> list[int]:
    """The sample grains a period reads: those of steps at most half a bucket long and coarser."""
    coarse = [level for level, seconds in enumerate(GRAINS, start=1) if seconds * 2 <= period.bucket_seconds]
    return list(range(coarse[-1], len(GRAINS) + 1)) if coarse else [0, *range(1, len(GRAINS) + 1)]


def _count(b: Bucket, outcome: str, n: int, processing_us: Any, critical_n: int, critical_us: Any,
           skewed: int) -> None:
    b.records += n
    b.retried += n if outcome == schema.RETRIED else 0
    b.failures += n if outcome in schema.FAILURES else 0
    if outcome in schema.HANDLER_RAN:
        b.processing_sum_ms += float(processing_us or 0) / 1000
        b.processing_n += n
    b.critical_sum_ms += float(critical_us or 0) / 1000
    b.critical_n += critical_n
    b.skewed += skewed


def times_of(rows: Iterable[tuple]) -> tuple[list[float], list[float], int]:
    """(processing ms of attempts whose handler ran, critical ms of processed ones, skewed count)."""
    processing, critical, skewed = [], [], 0
    for ended, started, sent, deliver_at, outcome, *_ in rows:
        if outcome in schema.HANDLER_RAN:
            processing.append(max(ended - started, 0) / 1000)
        origin = deliver_at if deliver_at is not None else sent
        if origin is not None and ended < origin:
            skewed += 1
        elif origin is not None and outcome == schema.PROCESSED:
            critical.append((ended - origin) / 1000)
    return processing, critical, skewed


def _percentiles_from_records(s: QueueSeries, rows: list[tuple], period: Period) -> None:
    s.sampled, s.newest = len(rows), rows
    processing, critical, _ = times_of(rows)
    s.processing_ms, s.critical_ms = percentiles(processing), percentiles(critical)
    per_bucket: dict[int, list[tuple]] = defaultdict(list)
    for row in rows:
        per_bucket[(row[0] - period.start_us) // period.bucket_us].append(row)
    for index, bucket_rows in per_bucket.items():
        if 0 <= index < len(s.buckets):
            p, c, _ = times_of(bucket_rows)
            s.buckets[index].processing_ms, s.buckets[index].critical_ms = percentiles(p), percentiles(c)


def _fill_lengths(series: dict[str, QueueSeries], period: Period) -> None:
    """The last queue-length sample of each bucket, one statement for every queue."""
    rows = list(lengths_query(list(series), period))
    if not all(grain == 0 for grain in _grains(period)):
        # Coarse samples begin their steps: the newest few make the last bucket's value current.
        recent = min(period.end_us, period.now_us) - int(2 * get_settings().MONITORING_SAMPLE_INTERVAL * US)
        rows += list(QueueSample.objects.using(get_settings().DATABASE)
                     .filter(queue__in=list(series), at_us__gte=max(recent, period.start_us), at_us__lt=period.end_us)
                     .order_by("queue", "at_us").values_list("queue", "at_us", "length", "estimated"))
        rows.sort(key=lambda row: (row[0], row[1]))
    seen: dict[str, list[int]] = defaultdict(list)
    for queue, at, length, estimated in rows:
        s = series[queue]
        index = (at - period.start_us) // period.bucket_us
        if 0 <= index < len(s.buckets):
            s.buckets[index].length = length
        seen[queue].append(length)
        s.length_last, s.length_estimated = length, estimated
    for queue, lengths in seen.items():
        series[queue].length_average = sum(lengths) / len(lengths)


def _bucket_seconds(period: Period) -> list[float]:
    """Each bucket's length in seconds (the last only up to now): the same for every queue."""
    start, width, now = period.start_us, period.bucket_us, period.now_us
    return [(min(start + (i + 1) * width, now) - (start + i * width)) / US for i in range(period.buckets)]


def _totals(s: QueueSeries, period: Period, seconds: list[float]) -> None:
    """A queue's period figures from its buckets; ``seconds``: :func:`_bucket_seconds`."""
    elapsed = max(1.0, (min(period.end_us, period.now_us) - period.start_us) / US)
    processing_n = critical_n = 0
    processing_ms = critical_ms = 0.0
    for b, length in zip(s.buckets, seconds):
        s.records += b.records
        s.retried += b.retried
        s.failures += b.failures
        s.skewed += b.skewed
        processing_n += b.processing_n
        critical_n += b.critical_n
        processing_ms += b.processing_sum_ms
        critical_ms += b.critical_sum_ms
        b.throughput_per_s = b.records / length if length > 0 else None
    s.throughput_per_s = s.records / elapsed
    s.processing_avg_ms = processing_ms / processing_n if processing_n else None
    s.critical_avg_ms = critical_ms / critical_n if critical_n else None
    if all(v is None for v in s.processing_ms.values()):  # no records read: the windows' figures
        windows = [b for b in s.buckets if b.from_windows]  # (only buckets fed by windows have any)
        for p in (50, 95, 99):
            s.processing_ms[p] = _average(b.processing_ms.get(p) for b in windows)
            s.critical_ms[p] = _average(b.critical_ms.get(p) for b in windows)


def _average(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def series_json(s: QueueSeries) -> dict[str, Any]:
    """A queue's figures as the JSON API shows them."""
    def pct(values: dict[int, float | None]) -> dict[str, float | None]:
        return {f"p{p}": values.get(p) for p in (50, 95, 99)}

    return {
        "queue": s.queue, "records": s.records, "retried": s.retried, "failures": s.failures,
        "throughput_per_s": s.throughput_per_s, "processing_avg_ms": s.processing_avg_ms,
        "critical_avg_ms": s.critical_avg_ms, "processing_ms": pct(s.processing_ms),
        "critical_ms": pct(s.critical_ms), "sampled": s.sampled, "skewed": s.skewed,
        "length": s.length_last, "length_average": s.length_average, "length_estimated": s.length_estimated,
        "buckets": [{"start": b.start.isoformat(), "records": b.records, "retried": b.retried,
                     "failures": b.failures, "throughput_per_s": b.throughput_per_s, "length": b.length,
                     "processing_avg_ms": b.processing_avg_ms, "critical_avg_ms": b.critical_avg_ms,
                     "processing_ms": pct(b.processing_ms), "critical_ms": pct(b.critical_ms),
                     "from_windows": b.from_windows} for b in s.buckets],
    }
