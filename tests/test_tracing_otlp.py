"""Spans and metrics leave over OTLP/HTTP: exported to a receiver on 127.0.0.1 and decoded
with opentelemetry-proto — from an installed SDK provider, and from a process that only
sets SLUICE_OTEL=1 and the standard OTEL_* variables."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from benchmarks.otlp_sink import OtlpSink
from core import tracing
from core.tracing.state import HISTOGRAMS
from tests.conftest import ROOT, database_url, drain

pytestmark = pytest.mark.timeout(90)


def exported_spans(sink: OtlpSink) -> tuple[dict[str, object], dict[str, str]]:
    """Span name → span, and the resource's string attributes, from every trace export."""
    spans, resource = {}, {}
    for body in sink.bodies("/v1/traces"):
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource.update({a.key: a.value.string_value for a in resource_spans.resource.attributes})
            for scope in resource_spans.scope_spans:
                assert scope.scope.name == "sluice"
                spans.update({span.name: span for span in scope.spans})
    return spans, resource


def test_spans_exported_over_otlp_http_decode_with_their_parents(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, ctx: None)
    with OtlpSink(keep=True) as sink:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{sink.endpoint}/v1/traces")))
        tracing.install(provider)
        try:
            transport.send(queue, "x")
            drain(pump_for(queue))
        finally:
            tracing.uninstall()
        provider.force_flush()
        provider.shutdown()
        spans, _ = exported_spans(sink)
    send, process = spans[f"send {queue}"], spans[f"process {queue}"]
    assert process.parent_span_id == send.span_id and process.trace_id == send.trace_id
    assert process.kind == process.SPAN_KIND_CONSUMER and send.kind == send.SPAN_KIND_PRODUCER
    attributes = {a.key: a.value for a in process.attributes}
    assert attributes["messaging.system"].string_value == "sluice"
    assert attributes["sluice.attempt"].int_value == 1


SCRIPT = textwrap.dedent("""
    import django
    django.setup()
    from core import tracing
    from core.handlers import handlers
    from core.receive.pump import MessagePump
    from core.transport import Transport

    queue = {queue!r}
    assert tracing.active() is not None, "SLUICE_OTEL=1 did not switch tracing on"
    handlers.register(queue, None, lambda message, context: None)
    Transport().send(queue, "x", message_type="Ping")
    pump = MessagePump(queue, concurrency=1, peek_delay=0.1)
    assert pump.receive_and_process(10) == 1
    pump.close()
""")


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_sluice_otel_sets_up_the_sdk_from_the_standard_variables(transport, queue, temporality):
    with OtlpSink(keep=True) as sink:
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "sluice.settings",
               "SLUICE_OTEL": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_SERVICE_NAME": "orders",
               "OTEL_TRACES_SAMPLER": "parentbased_always_on", "SLUICE_HANDLER_MODULES": "",
               "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": temporality}
        result = subprocess.run([sys.executable, "-c", SCRIPT.format(queue=queue)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        spans, resource = exported_spans(sink)  # flushed at exit by the SDK's shutdown
        metric_bodies = sink.bodies("/v1/metrics")
    assert resource["service.name"] == "orders"
    assert spans[f"process {queue}"].parent_span_id == spans[f"send {queue}"].span_id
    metrics = {metric.name: metric for body in metric_bodies
               for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics
               for sm in rm.scope_metrics for metric in sm.metrics}
    assert {"messaging.client.sent.messages", "messaging.client.consumed.messages", "messaging.process.duration",
            "sluice.messages.processed", "sluice.message.critical_time"} <= set(metrics)
    # The histograms Sluice aggregates itself (core.tracing.histograms) arrive as OTLP histograms.
    for name in ("messaging.process.duration", "sluice.message.critical_time"):
        [point] = metrics[name].histogram.data_points
        attributes = {a.key: a.value.string_value for a in point.attributes}
        assert attributes == {"messaging.system": "sluice", "messaging.destination.name": queue,
                              "sluice.message.type": "Ping"}
        assert point.count == 1 and sum(point.bucket_counts) == 1 and point.sum >= 0
        assert list(point.explicit_bounds) == list(HISTOGRAMS[name][2])
        assert metrics[name].histogram.aggregation_temporality == (2 if temporality == "cumulative" else 1)
