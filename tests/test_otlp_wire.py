"""Sluice writes OTLP trace requests itself (core.tracing.otlp_wire) because the SDK's
encoder cost more per span than a message's whole processing; what it writes must be
what the SDK's encoder writes:

- for any spans the SDK can make (attributes of every allowed type, events, links,
  statuses, kinds, remote and local parents, trace state), both requests decode to the
  same ``ExportTraceServiceRequest``;
- the cache of encoded attribute pairs never hands one value's bytes to another
  (``True`` and ``1``, ``0.0`` and ``-0.0``, an id key with thousands of values);
- the exporter Sluice sets up sends those bytes over OTLP/HTTP, and a batch the encoder
  cannot write goes out through the SDK's own encoder, as the SDK would send it.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from opentelemetry.trace import set_span_in_context

from benchmarks.otlp_sink import OtlpSink
from core.tracing import sdk
from core.tracing.otlp_wire import DISTINCT_LIMIT, Encoder
from core.tracing.span_exporter import WireSpanExporter, fits

pytestmark = pytest.mark.timeout(120)

texts = st.text(max_size=12)
ints = st.integers(-(1 << 63), (1 << 63) - 1)
floats = st.floats(allow_nan=False)
scalars = st.one_of(texts, st.booleans(), ints, floats)
# What the SDK keeps: scalars, homogeneous sequences of them (None allowed inside), bytes.
values = st.one_of(
    scalars, st.binary(max_size=8),
    st.lists(texts, max_size=3), st.lists(ints, max_size=3), st.lists(st.booleans(), max_size=3),
    st.lists(st.one_of(st.none(), floats), max_size=3),
)
attribute_maps = st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=6)
ids = st.integers(1, (1 << 63) - 1)


@st.composite
def span_specs(draw):
    return {
        "name": draw(st.text(max_size=20)),
        "kind": draw(st.sampled_from(list(SpanKind))),
        "attributes": draw(attribute_maps),
        "parent": draw(st.one_of(st.none(), st.tuples(ids, ids, st.booleans(), st.booleans()))),
        "trace_state": draw(st.dictionaries(st.sampled_from(["a", "vendor", "x1"]),
                                            st.sampled_from(["1", "on", "z-9"]), max_size=2)),
        "links": draw(st.lists(st.tuples(ids, ids, st.booleans(), attribute_maps), max_size=2)),
        "events": draw(st.lists(st.tuples(st.text(max_size=10), attribute_maps), max_size=2)),
        "status": draw(st.sampled_from([None, (StatusCode.OK, None), (StatusCode.ERROR, None),
                                        (StatusCode.ERROR, "it broke: ü")])),
    }


def make_spans(specs, resource=None):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource or Resource.create({"service.name": "wire-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers = [provider.get_tracer("sluice", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.27.0"),
               provider.get_tracer("other")]
    for n, spec in enumerate(specs):
        context = None
        if spec["parent"] is not None:
            trace_id, span_id, remote, sampled = spec["parent"]
            parent = SpanContext(trace_id, span_id, is_remote=remote, trace_flags=TraceFlags(1 if sampled else 0),
                                 trace_state=TraceState(list(spec["trace_state"].items())))
            context = set_span_in_context(NonRecordingSpan(parent))
        links = [Link(SpanContext(t, s, is_remote=r, trace_flags=TraceFlags(1)), a) for t, s, r, a in spec["links"]]
        span = tracers[n % 2].start_span(spec["name"], context=context, kind=spec["kind"],
                                         attributes=spec["attributes"], links=links)
        for name, attributes in spec["events"]:
            span.add_event(name, attributes)
        if spec["status"] is not None:
            span.set_status(*spec["status"])
        span.end()
    return list(exporter.get_finished_spans())


def sdk_request(spans) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(encode_spans(spans).SerializePartialToString())


def wire_request(spans, encoder=None) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString((encoder or Encoder()).request(spans))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(span_specs(), min_size=1, max_size=6))
def test_any_spans_encode_as_the_sdk_encodes_them(specs):
    spans = make_spans(specs)
    assert wire_request(spans) == sdk_request(spans)


#: One encoder for every example of the next test: whatever its caches hold from earlier
#: batches (pairs, names, kinds, the last status, keys turned wide), it writes what the SDK writes.
SHARED = Encoder()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(span_specs(), min_size=1, max_size=6))
def test_an_encoder_used_for_any_batches_in_turn_encodes_each_as_the_sdk_does(specs):
    spans = make_spans(specs)
    assert wire_request(spans, SHARED) == sdk_request(spans)


def test_an_encoder_keeps_its_answers_across_batches_sharing_values():
    """The second batch comes from the cache; it must still equal the SDK's."""
    specs = [{"name": "process q", "kind": SpanKind.CONSUMER, "parent": None, "trace_state": {}, "links": [],
              "events": [], "status": None,
              "attributes": {"messaging.system": "sluice", "sluice.attempt": n % 3, "flag": n % 2 == 0,
                             "sluice.batch_size": 100}} for n in range(20)]
    encoder = Encoder()
    for _ in range(3):
        spans = make_spans(specs)
        assert wire_request(spans, encoder) == sdk_request(spans)


def test_the_cache_tells_apart_values_python_calls_equal():
    specs = [{"name": "s", "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {}, "links": [], "events": [],
              "status": None, "attributes": {"v": value}}
             for value in (True, 1, False, 0, 1.0, 0.0, -0.0, (True,), (1,), "1")]
    spans = make_spans(specs)
    encoder = Encoder()
    assert wire_request(spans, encoder) == sdk_request(spans)
    assert wire_request(list(reversed(spans)), encoder) == sdk_request(list(reversed(spans)))


def test_an_id_key_stops_being_cached_and_stays_right():
    specs = [{"name": "s", "kind": SpanKind.CONSUMER, "parent": None, "trace_state": {}, "links": [], "events": [],
              "status": None, "attributes": {"messaging.message.id": f"id-{n}", "messaging.system": "sluice"}}
             for n in range(DISTINCT_LIMIT * 3)]
    spans = make_spans(specs)
    encoder = Encoder()
    assert wire_request(spans, encoder) == sdk_request(spans)
    assert "messaging.message.id" in encoder._wide
    assert all(key[0] != "messaging.message.id" for key in [*encoder._pairs, *encoder._strings])
    assert ("messaging.system", "sluice") in encoder._strings


def test_spans_of_two_resources_keep_their_own():
    first = make_spans([{"name": "a", "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {}, "links": [],
                         "events": [], "status": None, "attributes": {}}], Resource.create({"service.name": "one"}))
    second = make_spans([{"name": "b", "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {}, "links": [],
                          "events": [], "status": None, "attributes": {}}], Resource.create({"service.name": "two"}))
    assert wire_request(first + second) == sdk_request(first + second)


def posted(sink: OtlpSink) -> list[ExportTraceServiceRequest]:
    return [ExportTraceServiceRequest.FromString(body) for body in sink.bodies("/v1/traces")]


def test_the_exporter_sluice_sets_up_sends_the_wire_encoding(monkeypatch):
    spans = make_spans([{"name": f"process q{n}", "kind": SpanKind.CONSUMER, "parent": None, "trace_state": {},
                         "links": [], "events": [("sluice.retry.immediate", {"sluice.attempt": 1})],
                         "status": (StatusCode.ERROR, "boom"), "attributes": {"sluice.attempt": n}}
                        for n in range(5)])
    with OtlpSink(keep=True) as sink:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.endpoint)
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
        exporter = sdk.span_exporter()
        assert isinstance(exporter, WireSpanExporter)
        assert fits(exporter), "this SDK's exporter no longer has what the fast path sends through"
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    assert posted(sink) == [sdk_request(spans)]
    assert exporter._encoder._pairs, "the request was not written by Sluice's encoder"


def test_a_batch_the_encoder_cannot_write_goes_out_as_the_sdk_writes_it():
    """An integer past int64: the SDK's encoder drops that attribute (and logs it);
    the batch still goes out, with everything else."""
    spans = make_spans([{"name": "big", "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {}, "links": [],
                         "events": [], "status": None, "attributes": {"huge": 1 << 70, "kept": "yes"}}])
    with OtlpSink(keep=True) as sink:
        exporter = WireSpanExporter(endpoint=f"{sink.endpoint}/v1/traces")
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    [request] = posted(sink)
    assert request == sdk_request(spans)
    [kept] = request.resource_spans[0].scope_spans[0].spans[0].attributes
    assert kept.key == "kept"


def test_a_request_past_the_size_limit_is_refused_not_sent():
    spans = make_spans([{"name": "x" * 2000, "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {},
                         "links": [], "events": [], "status": None, "attributes": {}}])
    with OtlpSink(keep=True) as sink:
        exporter = WireSpanExporter(endpoint=f"{sink.endpoint}/v1/traces", max_request_size=1000)
        assert exporter.export(spans) is SpanExportResult.FAILURE
        exporter.shutdown()
    assert posted(sink) == []


def test_long_strings_are_encoded_every_time_not_kept():
    specs = [{"name": "s", "kind": SpanKind.INTERNAL, "parent": None, "trace_state": {}, "links": [], "events": [],
              "status": None, "attributes": {"exception.stacktrace": "x" * 500, "short": "y"}}]
    spans = make_spans(specs)
    encoder = Encoder()
    assert wire_request(spans, encoder) == sdk_request(spans)
    kept = {key[0] for key in [*encoder._pairs, *encoder._strings]}
    assert "short" in kept and "exception.stacktrace" not in kept
