"""The monitoring tab's periods and what a queue's figures over one are made of (buckets
and their sums); core.monitoring.live fills them."""
from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field

from core.db import database_now_us

#: The periods the tab offers (name → seconds) and how many buckets a chart has.
PERIODS = {"1m": 60, "5m": 300, "15m": 900, "1h": 3600}
BUCKETS = 30
#: The longest from–to range (31 days: a longer one keeps its newest part).
MAX_RANGE = dt.timedelta(days=31)
US = 1_000_000


@dataclass(frozen=True)
class Period:
    """A monitoring period: ``buckets`` buckets of ``bucket_seconds`` from ``start_us``."""

    name: str
    start_us: int
    end_us: int
    bucket_seconds: int
    #: The period ends now (the page refreshes once a bucket).
    live: bool
    #: The database's clock when it was made.
    now_us: int
    #: How a requested range was made to fit ("" when it was taken as it was).
    note: str = ""

    @property
    def bucket_us(self) -> int:
        return self.bucket_seconds * US

    @property
    def buckets(self) -> int:
        return (self.end_us - self.start_us) // self.bucket_us

    @property
    def refresh_seconds(self) -> int | None:
        """How often a live page refreshes: once a bucket, at least every 5 s; never for a past range."""
        return max(5, self.bucket_seconds) if self.live else None

    def bucket_starts(self) -> list[dt.datetime]:
        return [when(self.start_us + i * self.bucket_us) for i in range(self.buckets)]

    @property
    def start(self) -> dt.datetime:
        return when(self.start_us)

    @property
    def end(self) -> dt.datetime:
        return when(self.end_us)


def when(us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(us / US, dt.timezone.utc)


def micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return int(value.timestamp() * US)


def make_period(name: str = "5m", start: dt.datetime | None = None, end: dt.datetime | None = None,
                now_us: int | None = None) -> Period:
    """A period by name (``1m``, ``5m``, ``15m``, ``1h``) ending now, or ``range`` from
    ``start`` (default an hour before the end) to ``end`` (default now).  A range is made
    to fit rather than refused: its ends swapped when reversed, its end at most now, at most
    :data:`MAX_RANGE` long (the newest part); ``note`` says what was changed.  Raises
    ValueError for an unknown name."""
    now = database_now_us() if now_us is None else now_us
    if name in PERIODS:
        bucket = PERIODS[name] // BUCKETS
        end_us = -(-now // (bucket * US)) * bucket * US  # the bucket now lies in is the last one
        return Period(name, end_us - BUCKETS * bucket * US, end_us, bucket, True, now)
    if name != "range":
        raise ValueError(f"period must be one of {', '.join([*PERIODS, 'range'])}, not {name[:20]!r}")
    notes = []
    end_us = micros(end) if end is not None else now
    start_us = micros(start) if start is not None else end_us - 3600 * US
    if end_us < start_us:
        start_us, end_us = end_us, start_us
        notes.append("from and to swapped")
    if end_us > now:
        end_us = now
        notes.append("ends now")
    if end_us - start_us > MAX_RANGE.total_seconds() * US:
        start_us = end_us - int(MAX_RANGE.total_seconds()) * US
        notes.append(f"shortened to the last {MAX_RANGE.days} days of it")
    if end_us - start_us < 60 * US:
        start_us = end_us - 60 * US
        notes.append("widened to a minute")
    # Whole minutes (or whole hours for long ranges) per bucket: pipeline windows fit in them.
    raw = (end_us - start_us) / US / BUCKETS
    unit = 3600 if raw > 3600 else 60
    bucket = max(1, math.ceil(raw / unit)) * unit
    first = start_us // (bucket * US) * bucket * US
    count = -(-(end_us - first) // (bucket * US))
    return Period("range", first, first + count * bucket * US, bucket, end_us >= now - bucket * US, now,
                  "; ".join(notes))


@dataclass
class Bucket:
    start: dt.datetime
    #: Every handled attempt (every outcome), retried attempts, failures (pipeline.schema.FAILURES).
    records: int = 0
    retried: int = 0
    failures: int = 0
    throughput_per_s: float | None = None
    #: Sums and counts behind the averages: processing time of attempts whose handler ran,
    #: critical time of processed messages (skewed ones left out).
    processing_sum_ms: float = 0.0
    processing_n: int = 0
    critical_sum_ms: float = 0.0
    critical_n: int = 0
    skewed: int = 0
    #: Percentiles, from the newest records (one queue's page) or the pipeline's windows.
    processing_ms: dict[int, float | None] = field(default_factory=dict)
    critical_ms: dict[int, float | None] = field(default_factory=dict)
    #: The queue's length at the bucket's last sample (None: no sample in it).
    length: int | None = None
    #: The figures came (partly) from the pipeline's windows.
    from_windows: bool = False

    @property
    def processing_avg_ms(self) -> float | None:
        return self.processing_sum_ms / self.processing_n if self.processing_n else None

    @property
    def critical_avg_ms(self) -> float | None:
        return self.critical_sum_ms / self.critical_n if self.critical_n else None


@dataclass
class QueueSeries:
    queue: str
    buckets: list[Bucket]
    records: int = 0
    retried: int = 0
    failures: int = 0
    throughput_per_s: float = 0.0
    #: Averages over every record of the period (hours from windows: their medians).
    processing_avg_ms: float | None = None
    critical_avg_ms: float | None = None
    #: Percentiles from the newest records (asked for one queue), or the windows'.
    processing_ms: dict[int, float | None] = field(default_factory=dict)
    critical_ms: dict[int, float | None] = field(default_factory=dict)
    #: Records the percentiles were computed from (the newest of the period; 0: not asked).
    sampled: int = 0
    #: Records that ended before they were sent or due: a clock skew (left out of critical time).
    skewed: int = 0
    #: The newest records read for the percentiles (:func:`sample_query`'s rows).
    newest: list[tuple] = field(default_factory=list, repr=False)
    length_last: int | None = None
    length_average: float | None = None
    length_estimated: bool = False


def percentiles(values: list[float]) -> dict[int, float | None]:
    """p50, p95 and p99 of ``values`` (nearest rank), None each when there are none."""
    if not values:
        return {50: None, 95: None, 99: None}
    ordered = sorted(values)
    return {p: ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))] for p in (50, 95, 99)}
