"""Tracing fixtures: an in-memory tracer and meter installed for one test.

Sluice's engine traces with the providers given to ``core.tracing.install``, not with
OpenTelemetry's process-global ones (which can be set once per process), so every test
installs fresh in-memory providers and uninstalls them afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from core import tracing


@dataclass
class Recorded:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    provider: TracerProvider

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in self.spans()]}"
        return found[0]

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name → its data points (every scope, every attribute set)."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def total(self, name: str, **attributes: str) -> float:
        """The sum of a counter's points (or a histogram's counts) with these attributes."""
        points = [p for p in self.metrics().get(name, [])
                  if all(p.attributes.get(k.replace("_", ".")) == v for k, v in attributes.items())]
        return sum(getattr(p, "value", None) if hasattr(p, "value") else p.count for p in points)


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    tracing.install(provider, MeterProvider(metric_readers=[reader]))
    yield Recorded(exporter, reader, provider)
    tracing.uninstall()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def linked(span: ReadableSpan) -> set[tuple[int, int]]:
    return {(link.context.trace_id, link.context.span_id) for link in span.links}


def ids(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id
