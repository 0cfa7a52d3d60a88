"""The OpenTelemetry SDK set-up, from the standard ``OTEL_*`` variables.

Imported only when ``SLUICE_OTEL`` is on (core.tracing.state.configure): the SDK and the
exporters are the ``[otel]`` extra.  Providers the application set up already (its own
code, or ``opentelemetry-instrument``) are used as they are; otherwise Sluice makes SDK
ones and sets them as the process's global providers, so that instrumented libraries
(Django, Celery, psycopg) report into the same traces.

What the variables choose (the SDK's own names and defaults):

- ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``: the resource (service name
  defaults to ``sluice-<SLUICE_ENDPOINT>`` here, not the SDK's ``unknown_service``);
- ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``: the sampler;
- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``otlp`` (default), ``console`` or ``none``;
- ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the ``_TRACES_`` / ``_METRICS_`` variants):
  ``http/protobuf`` (default) or ``grpc``;
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the exporters' other variables: read by the exporters;
- ``OTEL_BSP_*`` (batch span processor) and ``OTEL_METRIC_EXPORT_INTERVAL``.
"""
from __future__ import annotations

import logging
import os

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from core.conf import get_settings
from core.tracing.histograms import Histograms, WithHistograms, prefers_delta
from core.tracing.recorded import Recorder, SluiceTracerProvider
from core.tracing.span_exporter import WireSpanExporter

log = logging.getLogger("sluice.tracing")

EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")


def resource() -> Resource:
    """The SDK's resource from the environment, named after the endpoint unless told otherwise."""
    found = Resource.create()
    if "OTEL_SERVICE_NAME" in os.environ or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        return found
    return found.merge(Resource.create({SERVICE_NAME: f"sluice-{get_settings().ENDPOINT}"}))


def _choice(names: tuple[str, ...], allowed: tuple[str, ...], default: str) -> str:
    for name in names:
        value = os.environ.get(name, "").strip().lower()
        if value:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not supported here (one of {', '.join(allowed)})")
            return value
    return default


def _protocol(signal: str) -> str:
    return _choice((f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), PROTOCOLS,
                   "http/protobuf")


def span_exporter() -> SpanExporter | None:
    kind = _choice(("OTEL_TRACES_EXPORTER",), EXPORTERS, "otlp")
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if _protocol("TRACES") == "grpc":
        # Imported only when asked for: loading gRPC costs a second and most collectors take HTTP.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
        return OTLPSpanExporter()
    # The SDK's exporter with Sluice's wire encoder (core.tracing.span_exporter): a
    # tenth of the SDK's encoding cost per span, in the worker's own process.
    return WireSpanExporter()


def metric_exporter() -> MetricExporter | None:
    kind = _choice(("OTEL_METRICS_EXPORTER",), EXPORTERS, "otlp")
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleMetricExporter()
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter  # noqa: PLC0415 — as above
        return OTLPMetricExporter()
    return HttpMetricExporter()


def tracer_provider(exporter: SpanExporter | None) -> tuple[SluiceTracerProvider, Recorder | None]:
    """Sluice's tracer provider exporting through ``exporter`` in batches; and, when that
    is Sluice's own OTLP exporter, the recorder of its sampled process spans
    (core.tracing.recorded)."""
    provider = SluiceTracerProvider(resource=resource())
    if exporter is None:
        return provider, None
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider, (Recorder(provider, processor) if isinstance(exporter, WireSpanExporter) else None)


def sdk_meter_provider(exporter: MetricExporter) -> tuple[MeterProvider, Histograms]:
    """Sluice's meter provider exporting through ``exporter`` periodically, and the
    histograms it aggregates itself (core.tracing.histograms) merged into each export."""
    histograms = Histograms(delta=prefers_delta(exporter))
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(WithHistograms(exporter, histograms))],
                             resource=resource())
    return provider, histograms


def providers() -> tuple[trace.TracerProvider, metrics.MeterProvider, Histograms | None, Recorder | None]:
    """The process's SDK providers: the application's when it made them, else new ones,
    set as global; when Sluice made the meter provider, the histograms its exporter adds
    (core.tracing.histograms); when it made the tracer provider, its span recorder."""
    histograms = recorder = None
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider, recorder = tracer_provider(span_exporter())
        trace.set_tracer_provider(provider)
    meter_provider = metrics.get_meter_provider()
    if not isinstance(meter_provider, MeterProvider):
        exporter = metric_exporter()
        if exporter is None:
            # Traces only: the no-op meter makes recording free, not merely unexported.
            meter_provider = metrics.NoOpMeterProvider()
        else:
            meter_provider, histograms = sdk_meter_provider(exporter)
            metrics.set_meter_provider(meter_provider)
    log.info("OpenTelemetry on: traces and metrics of endpoint %s", get_settings().ENDPOINT)
    return provider, meter_provider, histograms, recorder
