"""When Sluice built the whole trace pipeline (``SLUICE_OTEL=1`` without the application's
own tracer provider), a message whose sender was sampled gets a span Sluice records
itself (core.tracing.recorded) instead of the SDK's.  What reaches the collector must
not tell them apart:

- the same messages — a success, a failure then an immediate retry, a handler that sets
  attributes, adds an event and sends onward — export the same spans through both;
- any sequence of span calls a handler could make (attributes, events, links, statuses,
  exceptions, calls after the end) leaves a recorded span as it leaves an SDK span;
- the recorder stands aside when the pipeline is not only Sluice's: another span
  processor, a sampler that drops sampled parents, truncated attribute values.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from benchmarks.otlp_sink import OtlpSink
from core import tracing
from core.tracing import sdk
from core.tracing.recorded import Recorder, RecordedSpan, SluiceTracerProvider
from core.tracing.span_exporter import WireSpanExporter
from tests.conftest import drain

pytestmark = pytest.mark.timeout(120)

#: Attributes whose values differ from run to run (ids); their presence is still compared.
VARYING = {"messaging.message.id", "messaging.message.conversation_id"}


def exported(sink: OtlpSink) -> list:
    return [span for body in sink.bodies("/v1/traces")
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans
            for scope in resource.scope_spans for span in scope.spans]


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def described(spans: list, queues: dict[str, str]) -> list[tuple]:
    """Each span without its ids and times (and with its queues' names replaced by
    ``queues``' placeholders): name, kind, its parent's name, whether it is in its
    parent's trace, attributes, events, links, status, flags; sorted."""
    by_id = {span.span_id: span for span in spans}

    def plain(value):
        return queues.get(value, value) if isinstance(value, str) else value

    def name(span):
        verb, _, queue = span.name.partition(" ")
        return f"{verb} {queues.get(queue, queue)}"

    out = []
    for span in spans:
        parent = by_id.get(span.parent_span_id)
        attributes = tuple(sorted((a.key, "…" if a.key in VARYING else plain(value_of(a.value)))
                                  for a in span.attributes))
        events = tuple((e.name, tuple(sorted((a.key, value_of(a.value)) for a in e.attributes))) for e in span.events)
        out.append((name(span), span.kind, name(parent) if parent else None,
                    parent is not None and parent.trace_id == span.trace_id, attributes, events, len(span.links),
                    span.status.code, span.status.message, span.flags, span.dropped_attributes_count))
    return sorted(out, key=repr)


def sluice_pipeline(endpoint: str) -> tuple[TracerProvider, Recorder | None]:
    """What SLUICE_OTEL=1 builds (core.tracing.sdk), exporting to ``endpoint``."""
    return sdk.tracer_provider(WireSpanExporter(endpoint=f"{endpoint}/v1/traces"))


def sdk_pipeline(endpoint: str) -> TracerProvider:
    """The same export through the SDK's own spans (an application's provider)."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(WireSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    return provider


def run_path(path: str, transport, make_queue, pump_for, temp_handlers) -> tuple[list, set[type]]:
    """Three traced messages through a pump with tracing on ``path``'s pipeline: the spans
    the collector got (described), and the types of the spans current in the handlers."""
    source, target = make_queue(), make_queue()
    current_types: set[type] = set()
    failed_once: set[int] = set()

    def handler(message, context):
        span = trace.get_current_span()
        current_types.add(type(span))
        number = message.json()["n"]
        span.set_attribute("order.lines", number)
        if number == 1 and number not in failed_once:
            failed_once.add(number)
            raise ValueError("out of stock")
        if number == 2:
            span.add_event("order.checked", {"order.total": 9.5, "order.tags": ("a", "b")})
            span.set_attribute("order.lines", 20)  # set again: the later value wins
            context.send(target, {"bill": number}, message_type="BillOrder")

    temp_handlers(source, "PlaceOrder", handler)
    with OtlpSink(keep=True) as sink:
        if path == "sluice":
            provider, recorder = sluice_pipeline(sink.endpoint)
            assert recorder is not None and recorder.usable()
        else:
            provider, recorder = sdk_pipeline(sink.endpoint), None
        tracing.install(provider, recorder=recorder)
        try:
            for number in range(3):
                transport.send(source, {"n": number}, message_type="PlaceOrder")
            drain(pump_for(source, concurrency=1, immediate_retries=1))
        finally:
            tracing.uninstall()
        provider.force_flush()
        provider.shutdown()
        return described(exported(sink), {source: "SOURCE", target: "TARGET"}), current_types


def test_the_same_messages_export_the_same_spans_through_either_path(transport, make_queue, pump_for, temp_handlers):
    sdk_spans, sdk_types = run_path("sdk", transport, make_queue, pump_for, temp_handlers)
    sluice_spans, sluice_types = run_path("sluice", transport, make_queue, pump_for, temp_handlers)
    assert RecordedSpan in sluice_types and RecordedSpan not in sdk_types
    assert sluice_spans == sdk_spans
    # and what they hold is the story of those messages:
    process = [d for d in sluice_spans if d[0] == "process SOURCE"]
    assert len(process) >= 4 and all(d[2] == "send SOURCE" and d[3] for d in process)
    assert any(d[7] == 2 and d[5][0][0] == "sluice.retry.immediate" for d in process), "the failed attempt"
    assert any(("order.lines", 20) in d[4] and d[5][0][0] == "order.checked" for d in process), "the handler's event"
    [onward] = [d for d in sluice_spans if d[0] == "send TARGET"]
    assert onward[2] == "process SOURCE" and onward[3]


# Any sequence of span calls, on an SDK span and on a recorded span.

keys = st.sampled_from(["order.id", "order.lines", "sluice.attempt", "", "x"])
attribute_values = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.booleans(), st.floats(allow_nan=False),
                             st.lists(st.integers(0, 3), max_size=2), st.none(), st.just({"nested": 1}))
attribute_maps = st.dictionaries(keys, attribute_values, max_size=3)
span_contexts = st.builds(lambda t, s, state: SpanContext(t, s, is_remote=True, trace_flags=TraceFlags(1),
                                                           trace_state=trace.TraceState([("k", "v")] if state else [])),
                          st.integers(0, 3), st.integers(0, 3), st.booleans())
calls = st.one_of(
    st.tuples(st.just("set_attribute"), keys, attribute_values),
    st.tuples(st.just("set_attributes"), attribute_maps),
    st.tuples(st.just("add_event"), st.text(max_size=5), attribute_maps),
    st.tuples(st.just("add_link"), span_contexts, attribute_maps),
    st.tuples(st.just("set_status"), st.sampled_from(list(StatusCode)), st.one_of(st.none(), st.text(max_size=5))),
    st.tuples(st.just("set_status_object"), st.sampled_from(list(StatusCode)), st.one_of(st.none(), st.text(max_size=5))),
    st.tuples(st.just("record_exception"), st.sampled_from([ValueError("no stock"), KeyError("k")])),
    st.tuples(st.just("update_name"), st.text(max_size=5)),
    st.tuples(st.just("end")),
)

PARENT = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                     trace_flags=TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID))
SLUICE_ATTRIBUTES = {"messaging.system": "sluice", "messaging.destination.name": "orders", "sluice.attempt": 1}


def apply(span, sequence) -> None:
    for call in sequence:
        name, args = call[0], call[1:]
        if name == "set_status_object":
            span.set_status(trace.Status(args[0], args[1] if args[0] is StatusCode.ERROR else None))
        else:
            getattr(span, name)(*args)
    if span.is_recording():
        span.end()


def finished(span) -> tuple:
    return (span.name, span.kind, span.context.trace_id, span.context.trace_flags, span.parent.span_id,
            dict(span.attributes), span.dropped_attributes,
            [(e.name, dict(e.attributes), e.dropped_attributes) for e in span.events], span.dropped_events,
            [(link.context, dict(link.attributes)) for link in span.links], span.dropped_links,
            span.status.status_code, span.status.description, span.end_time is not None,
            span.resource.attributes == span.resource.attributes, span.instrumentation_scope)


def both(sequence) -> tuple[tuple, tuple]:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("sluice", tracing.state.__version__, schema_url=tracing.state.SCHEMA_URL)
    span = tracer.start_span("process orders", context=trace.set_span_in_context(NonRecordingSpan(PARENT)),
                             kind=SpanKind.CONSUMER)
    span.set_attributes(SLUICE_ATTRIBUTES)
    apply(span, sequence)

    recorded_exported = InMemorySpanExporter()
    own = SluiceTracerProvider()
    processor = SimpleSpanProcessor(recorded_exported)
    own.add_span_processor(processor)
    recorder = Recorder(own, processor)
    assert recorder.usable()
    apply(recorder.start("process orders", PARENT, dict(SLUICE_ATTRIBUTES)), sequence)
    [sdk_span], [our_span] = exported.get_finished_spans(), recorded_exported.get_finished_spans()
    assert isinstance(our_span, RecordedSpan)
    return finished(sdk_span), finished(our_span)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(calls, max_size=8))
def test_any_span_calls_leave_a_recorded_span_as_they_leave_an_sdk_span(sequence):
    sdk_span, our_span = both(sequence)
    assert our_span == sdk_span


def test_the_span_limits_apply_as_they_do_to_an_sdk_span(monkeypatch):
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "2")
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "1")
    monkeypatch.setenv("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "1")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "40")
    sequence = [("add_event", f"e{n}", {"a": n, "b": n}) for n in range(4)]
    sequence += [("add_link", SpanContext(n + 1, n + 1, True), {"n": n}) for n in range(3)]
    sequence += [("set_attribute", f"k{n}", n) for n in range(45)]
    sdk_span, our_span = both(sequence)
    assert our_span == sdk_span
    assert our_span[8] == 2 and our_span[10] == 2 and our_span[6] > 0  # dropped events, links, attributes


# When the recorder stands aside.

def recorder_for(monkeypatch, **env) -> Recorder | None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, recorder = sdk.tracer_provider(WireSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    return recorder


def test_the_recorder_is_used_only_with_sluices_own_exporter():
    provider, recorder = sdk.tracer_provider(InMemorySpanExporter())
    assert recorder is None
    provider, recorder = sdk.tracer_provider(None)
    assert recorder is None


def test_the_recorder_stands_aside_when_the_application_adds_a_span_processor(monkeypatch):
    provider, recorder = sdk.tracer_provider(WireSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    assert recorder.usable()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert not recorder.usable()


@pytest.mark.parametrize("env", [
    {"OTEL_TRACES_SAMPLER": "always_off"},
    {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},  # ignores the parent
    {"OTEL_SDK_DISABLED": "true"},
    {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10"},
    {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10"},
    {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "5"},
    {"OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED": "true"},
])
def test_the_recorder_stands_aside_when_the_sdk_would_decide_or_cut_differently(monkeypatch, env):
    assert not recorder_for(monkeypatch, **env).usable()


@pytest.mark.parametrize("env", [{}, {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
                                 {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}])
def test_a_parent_based_sampler_keeps_the_recorder(monkeypatch, env):
    """Whatever a parent-based sampler does with new traces, a sampled parent's child is sampled."""
    assert recorder_for(monkeypatch, **env).usable()


def test_an_unusable_recorder_leaves_the_span_to_the_sdk(transport, queue, pump_for, temp_handlers):
    seen: list[type] = []
    temp_handlers(queue, None, lambda m, ctx: seen.append(type(trace.get_current_span())))
    kept = InMemorySpanExporter()
    provider, recorder = sdk.tracer_provider(WireSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    provider.add_span_processor(SimpleSpanProcessor(kept))  # the application's own processor
    tracing.install(provider, recorder=recorder)
    try:
        transport.send(queue, "x")
        drain(pump_for(queue, concurrency=1))
    finally:
        tracing.uninstall()
    assert seen and RecordedSpan not in seen
    assert f"process {queue}" in [span.name for span in kept.get_finished_spans()]
    provider.shutdown()


def test_a_recorded_span_reports_its_providers_resource_when_exported():
    """A forked child's SDK gives its provider a resource of its own: read at export."""
    provider, recorder = sdk.tracer_provider(WireSpanExporter(endpoint="http://127.0.0.1:9/v1/traces"))
    span = recorder.start("process q", PARENT, {})
    assert span.resource is provider.resource
    provider.shutdown()


def test_a_recorded_span_touched_from_many_threads_loses_nothing():
    import threading

    kept = InMemorySpanExporter()
    own = SluiceTracerProvider()
    processor = SimpleSpanProcessor(kept)
    own.add_span_processor(processor)
    span = Recorder(own, processor).start("process q", PARENT, {"messaging.system": "sluice"})

    def work(n):
        for k in range(5):
            span.set_attribute(f"t{n}.{k}", k)
            span.add_event(f"e{n}.{k}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    span.end()
    [done] = kept.get_finished_spans()
    assert len(done.attributes) == 1 + 40 and len(done.events) == 40


def test_recorded_and_sdk_spans_of_one_scope_export_in_one_group_as_the_sdk_writes_them():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from core.tracing.otlp_wire import Encoder

    kept = InMemorySpanExporter()
    provider = SluiceTracerProvider()
    processor = SimpleSpanProcessor(kept)
    provider.add_span_processor(processor)
    recorder = Recorder(provider, processor)
    tracer = provider.get_tracer("sluice", tracing.state.__version__, schema_url=tracing.state.SCHEMA_URL)
    recorder.start("process q", PARENT, {"sluice.attempt": 1}).end()
    tracer.start_span("process q", kind=SpanKind.CONSUMER).end()
    spans = kept.get_finished_spans()
    assert Encoder().request(spans) == encode_spans(spans).SerializePartialToString()
