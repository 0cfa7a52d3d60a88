"""Sluice's two per-message histograms (processing time, critical time), aggregated by
Sluice itself when Sluice set up the metrics SDK, and handed to the exporter with the
SDK's own metrics.

Why not ``Histogram.record``: the Python SDK cleans and hashes the attributes of every
measurement, 7–20 µs a call; two calls per message cost a noop handler's drain a third of
its throughput (docs/benchmarks.md).  Here a batch's values are added under one lock,
well under 1 µs a value, into the same data the SDK would make: explicit-bucket histogram
points (count, sum, min, max, bucket counts) per attribute set, cumulative unless the
exporter prefers deltas.

With a meter provider the application (or a test) set up, Sluice cannot reach its
exporter: :mod:`core.tracing.consuming` then records through the API, value by value.
"""
from __future__ import annotations

import threading
import time
from bisect import bisect_right
from functools import reduce
from operator import add
from dataclasses import replace
from typing import Iterable, Sequence

from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality, Histogram, HistogramDataPoint, Metric, MetricExporter, MetricExportResult,
    MetricsData, ResourceMetrics, ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from core.tracing.names import HISTOGRAMS, SCHEMA_URL, SCOPE
from core import __version__

#: An attribute set, as a hashable tuple of (key, value) pairs.
Labels = tuple[tuple[str, str], ...]


class _Series:
    """One attribute set's aggregate: what an SDK explicit-bucket histogram point holds."""

    __slots__ = ("count", "total", "low", "high", "buckets")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.count = 0
        self.total = 0.0
        self.low = float("inf")
        self.high = float("-inf")
        self.buckets = [0] * (len(bounds) + 1)


class Histograms:
    """The aggregates of the histograms in :data:`core.tracing.names.HISTOGRAMS`; written by
    pump threads after each batch's commit, read by the exporter's thread."""

    def __init__(self, delta: bool = False) -> None:
        self.delta = delta
        self._lock = threading.Lock()
        self._series: dict[tuple[str, Labels], _Series] = {}
        self._start_ns = time.time_ns()

    def record_all(self, name: str, labels: Labels, values: Iterable[float]) -> None:
        """Add ``values`` (seconds) to one histogram's series for ``labels``."""
        values = list(values)
        if not values:
            return
        bounds = HISTOGRAMS[name][2]
        # Bucketed once per bound, not once per value: a batch's values sorted (in C), then
        # how many fall at or below each bound (buckets are upper-inclusive, as OTLP defines
        # them).  The sum is added in the values' order, as the SDK adds them.
        ordered = sorted(values)
        counts = []
        below = 0
        for bound in bounds:
            up_to = bisect_right(ordered, bound, below)
            counts.append(up_to - below)
            below = up_to
        counts.append(len(ordered) - below)
        with self._lock:
            series = self._series.get((name, labels))
            if series is None:
                series = self._series[(name, labels)] = _Series(bounds)
            series.buckets = list(map(add, series.buckets, counts))
            series.count += len(ordered)
            series.total = reduce(add, values, series.total)
            series.low = min(series.low, ordered[0])
            series.high = max(series.high, ordered[-1])

    def collect(self) -> list[Metric]:
        """The histograms as SDK metrics (none while nothing was recorded); with deltas,
        what was recorded since the last call."""
        now = time.time_ns()
        with self._lock:
            taken = self._series
            start = self._start_ns
            if self.delta:
                self._series, self._start_ns = {}, now
            points: dict[str, list[HistogramDataPoint]] = {}
            for (name, labels), series in taken.items():
                points.setdefault(name, []).append(HistogramDataPoint(
                    attributes=dict(labels), start_time_unix_nano=start, time_unix_nano=now,
                    count=series.count, sum=series.total, bucket_counts=list(series.buckets),
                    explicit_bounds=list(HISTOGRAMS[name][2]), min=series.low, max=series.high))
        temporality = AggregationTemporality.DELTA if self.delta else AggregationTemporality.CUMULATIVE
        return [Metric(name=name, description=HISTOGRAMS[name][1], unit=HISTOGRAMS[name][0],
                       data=Histogram(data_points=found, aggregation_temporality=temporality))
                for name, found in points.items()]


class WithHistograms(MetricExporter):
    """A metric exporter that adds :class:`Histograms` to what the SDK's reader hands it,
    in Sluice's instrumentation scope, then passes everything to ``inner``."""

    def __init__(self, inner: MetricExporter, histograms: Histograms) -> None:
        # The reader asks its exporter for its preferences: pass the inner one's on.
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self.inner = inner
        self.histograms = histograms

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if metrics_data.resource_metrics:  # else keep them: a delta collect would drop them
            metrics_data = merged(metrics_data, self.histograms.collect())
        return self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def prefers_delta(exporter: MetricExporter) -> bool:
    """Whether ``exporter`` asked for delta histograms (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE)."""
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return preferred.get(HistogramInstrument) is AggregationTemporality.DELTA


def merged(metrics_data: MetricsData, extra: list[Metric]) -> MetricsData:
    """``metrics_data`` with ``extra`` in Sluice's scope of its first resource."""
    if not extra:
        return metrics_data
    first, *rest = metrics_data.resource_metrics
    scopes = list(first.scope_metrics)
    for index, scope in enumerate(scopes):
        if scope.scope.name == SCOPE:
            scopes[index] = replace(scope, metrics=[*scope.metrics, *extra])
            break
    else:
        scopes.append(ScopeMetrics(scope=InstrumentationScope(SCOPE, __version__, SCHEMA_URL), metrics=extra,
                                   schema_url=SCHEMA_URL))
    resource_metrics: list[ResourceMetrics] = [replace(first, scope_metrics=scopes), *rest]
    return replace(metrics_data, resource_metrics=resource_metrics)
