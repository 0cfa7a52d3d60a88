"""The short cuts that keep tracing cheap give the answers the SDK would:

- a plain ``traceparent`` is read by hand exactly as the W3C propagator reads it;
- a message whose sender was not sampled gets, under parent-based sampling, an unsampled
  span with an id of its own, and what its handler sends stays in the sender's trace;
  a sampler that would sample it anyway is asked, not bypassed;
- the histograms Sluice aggregates itself (when it set up the metrics SDK) hold what the
  SDK's own aggregation holds for the same values, cumulative or delta.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality, InMemoryMetricReader, MetricExporter, MetricExportResult, PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

from core import tracing
from core.tracing.histograms import Histograms, WithHistograms
from core.tracing.propagation import PROPAGATOR, extract, span_context
from core.tracing.state import CRITICAL_TIME, HISTOGRAMS, PROCESS_DURATION, follows_unsampled_parent
from tests.conftest import drain

pytestmark = pytest.mark.timeout(60)

HEX = "0123456789abcdefABCDEF"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"

traceparents = st.one_of(
    st.builds(lambda v, t, s, f: f"{v}-{t}-{s}-{f}",
              st.sampled_from(["00", "01", "ff", "0g", "0"]),
              st.one_of(st.text(HEX, min_size=32, max_size=32), st.just("0" * 32)),
              st.one_of(st.text(HEX, min_size=16, max_size=16), st.just("0" * 16)),
              st.one_of(st.text(HEX, min_size=2, max_size=2), st.just("0"))),
    st.builds(lambda extra: f"00-{TRACE_ID}-{SPAN_ID}-01{extra}", st.sampled_from(["", " ", "-x", "\t", "0"])),
    st.text(max_size=60),
)


def span_of(context: Context):
    return trace.get_current_span(context).get_span_context()


@settings(max_examples=300, deadline=None)
@given(traceparents)
def test_a_traceparent_read_by_hand_is_what_the_propagator_reads(traceparent):
    ours = span_of(extract({"traceparent": traceparent}))
    theirs = span_of(PROPAGATOR.extract({"traceparent": traceparent}, Context()))
    assert (ours.is_valid, ours.trace_id, ours.span_id, ours.trace_flags, ours.is_remote) == \
           (theirs.is_valid, theirs.trace_id, theirs.span_id, theirs.trace_flags, theirs.is_remote)


def test_parent_based_samplers_are_recognised_and_others_decide_for_themselves():
    def tracer(sampler):
        return TracerProvider(sampler=sampler).get_tracer("t")
    assert follows_unsampled_parent(tracer(ParentBased(ALWAYS_ON)))
    assert follows_unsampled_parent(tracer(ParentBased(TraceIdRatioBased(0.5))))
    # Told to sample a child of an unsampled remote parent: the sampler is asked.
    assert not follows_unsampled_parent(tracer(ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON)))
    assert not follows_unsampled_parent(tracer(ALWAYS_ON))
    assert not follows_unsampled_parent(trace.NoOpTracer())


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()

    def install(sampler):
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracing.install(provider, MeterProvider(metric_readers=[InMemoryMetricReader()]))
        return exporter
    yield install
    tracing.uninstall()


def unsampled_send(transport, queue: str, flags: str = "00") -> str:
    """A message sent by an instrumented producer whose trace was not sampled (sent before
    tracing is installed here: Sluice's own send span would replace the header)."""
    return transport.send(queue, {"n": 1}, message_type="PlaceOrder",
                          headers={"traceparent": f"00-{TRACE_ID}-{SPAN_ID}-{flags}"})


# 02: not sampled, with the W3C level-2 "random trace id" flag the SDK sets.
@pytest.mark.parametrize("flags", ["00", "02"])
def test_an_unsampled_senders_message_is_not_recorded_and_its_sends_stay_in_the_trace(
        spans, transport, make_queue, pump_for, temp_handlers, flags):
    source, target = make_queue(), make_queue()
    seen = []

    def handle(message, ctx):
        seen.append(trace.get_current_span().get_span_context())
        ctx.send(target, {"bill": 1}, message_type="BillOrder")
    temp_handlers(source, "PlaceOrder", handle)
    unsampled_send(transport, source, flags)
    exporter = spans(ParentBased(ALWAYS_ON))
    drain(pump_for(source, concurrency=1))

    assert [s.name for s in exporter.get_finished_spans() if s.name.startswith("process")] == []
    current = seen[0]
    assert current.trace_id == int(TRACE_ID, 16) and current.trace_flags == int(flags, 16)
    assert current.span_id not in (0, int(SPAN_ID, 16))  # a span of its own, as the SDK makes
    onward = span_context(transport.browse(target)[0].headers)
    assert onward.trace_id == int(TRACE_ID, 16) and onward.trace_flags == int(flags, 16)


def test_an_unsampled_messages_span_id_comes_from_the_providers_own_id_generator(
        transport, queue, pump_for, temp_handlers):
    # The SDK's random generator is drawn from directly; any other is asked.
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    from core.tracing.state import span_id_source

    class Counting(RandomIdGenerator):
        def __init__(self):
            self.next = 41

        def generate_span_id(self):
            self.next += 1
            return self.next

    assert span_id_source(TracerProvider().get_tracer("t"))() != 0
    seen = []
    temp_handlers(queue, "PlaceOrder", lambda m, ctx: seen.append(trace.get_current_span().get_span_context()))
    unsampled_send(transport, queue)
    tracing.install(TracerProvider(sampler=ParentBased(ALWAYS_ON), id_generator=Counting()),
                    MeterProvider(metric_readers=[InMemoryMetricReader()]))
    try:
        drain(pump_for(queue, concurrency=1))
    finally:
        tracing.uninstall()
    assert [context.span_id for context in seen] == [42]


def test_a_sampler_that_samples_unsampled_parents_still_gets_its_span(
        spans, transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, "PlaceOrder", lambda m, ctx: None)
    unsampled_send(transport, queue)
    exporter = spans(ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON))
    drain(pump_for(queue, concurrency=1))
    process = [s for s in exporter.get_finished_spans() if s.name == f"process {queue}"]
    assert len(process) == 1 and process[0].context.trace_id == int(TRACE_ID, 16)
    assert process[0].parent.span_id == int(SPAN_ID, 16)


class Captured(MetricExporter):
    def __init__(self, temporality=None):
        super().__init__(preferred_temporality=temporality)
        self.exports = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def points(metrics_data, name):
    return [point for rm in metrics_data.resource_metrics for sm in rm.scope_metrics for metric in sm.metrics
            if metric.name == name for point in metric.data.data_points]


VALUES = [0.0, 0.004, 0.005, 0.0051, 0.3, 2.5, 9.99, 12.0, 3_700.0]
LABELS = (("messaging.system", "sluice"), ("messaging.destination.name", "orders"),
          ("sluice.message.type", "PlaceOrder"))


@pytest.mark.parametrize("name", [PROCESS_DURATION, CRITICAL_TIME])
def test_sluices_histograms_hold_what_the_sdk_would(name):
    reader = InMemoryMetricReader()
    unit, description, bounds = HISTOGRAMS[name]
    instrument = MeterProvider(metric_readers=[reader]).get_meter("sluice").create_histogram(
        name, unit, description, explicit_bucket_boundaries_advisory=bounds)
    for value in VALUES:
        instrument.record(value, dict(LABELS))
    [expected] = points(reader.get_metrics_data(), name)

    histograms = Histograms()
    histograms.record_all(name, LABELS, VALUES[:4])
    histograms.record_all(name, LABELS, VALUES[4:])
    [metric] = histograms.collect()
    [ours] = metric.data.data_points
    assert metric.name == name and metric.unit == unit
    assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
    assert (ours.count, ours.sum, list(ours.bucket_counts), list(ours.explicit_bounds), ours.min, ours.max,
            dict(ours.attributes)) == \
           (expected.count, expected.sum, list(expected.bucket_counts), list(expected.explicit_bounds),
            expected.min, expected.max, dict(expected.attributes))


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from([PROCESS_DURATION, CRITICAL_TIME]),
       batches=st.lists(st.lists(st.floats(min_value=0, max_value=1e5, allow_nan=False), max_size=40), max_size=5))
def test_batches_of_any_values_in_any_order_are_bucketed_as_the_sdk_buckets_them_one_by_one(name, batches):
    # Sluice sorts each batch and counts per bound; the SDK places each value on its own.
    # Values on a bound, between bounds, zero, repeated, unsorted, in empty batches.
    batches = [batch + [HISTOGRAMS[name][2][i % len(HISTOGRAMS[name][2])] for i in range(len(batch) % 3)]
               for batch in batches]
    reader = InMemoryMetricReader()
    unit, description, bounds = HISTOGRAMS[name]
    instrument = MeterProvider(metric_readers=[reader]).get_meter("sluice").create_histogram(
        name, unit, description, explicit_bucket_boundaries_advisory=bounds)
    histograms = Histograms()
    for batch in batches:
        for value in batch:
            instrument.record(value, dict(LABELS))
        histograms.record_all(name, LABELS, iter(batch))  # any iterable, read once
    expected = points(reader.get_metrics_data(), name) if any(batches) else []
    got = [point for metric in histograms.collect() for point in metric.data.data_points]
    assert [(p.count, p.sum, list(p.bucket_counts), p.min, p.max) for p in got] == \
           [(p.count, p.sum, list(p.bucket_counts), p.min, p.max) for p in expected]


def test_a_call_makes_its_span_current_through_opentelemetrys_own_attach_under_another_runtime_context(monkeypatch):
    # The default runtime context is a context variable, set and reset directly; any other
    # (OTEL_PYTHON_CONTEXT) goes through opentelemetry.context.attach and detach.
    from opentelemetry import context as otel_context
    from opentelemetry.context.context import _RuntimeContext

    from core.tracing import consuming

    assert consuming._attach.__self__ is otel_context._RUNTIME_CONTEXT._current_context

    class Elsewhere(_RuntimeContext):
        def attach(self, context):
            return context

        def get_current(self):
            return Context()

        def detach(self, token):
            pass

    monkeypatch.setattr(otel_context, "_RUNTIME_CONTEXT", Elsewhere())
    assert consuming._context_switch() == (otel_context.attach, otel_context.detach)


@pytest.mark.parametrize("delta", [False, True])
def test_the_exporter_gets_the_histograms_in_sluices_scope_beside_the_sdks_metrics(delta):
    from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
    captured = Captured({HistogramInstrument: AggregationTemporality.DELTA} if delta else None)
    histograms = Histograms(delta=delta)
    reader = PeriodicExportingMetricReader(WithHistograms(captured, histograms), export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    counter = provider.get_meter("sluice").create_counter("sluice.messages.processed")
    try:
        for round_ in (1, 2):
            counter.add(3, dict(LABELS))
            histograms.record_all(PROCESS_DURATION, LABELS, [0.001, 0.002, 0.003])
            reader.collect()
            [point] = points(captured.exports[-1], PROCESS_DURATION)
            assert point.count == (3 if delta else 3 * round_)
            scopes = [sm.scope.name for rm in captured.exports[-1].resource_metrics for sm in rm.scope_metrics]
            assert scopes == ["sluice"]  # one scope: the SDK's counters and Sluice's histograms
    finally:
        provider.shutdown()
