"""OpenTelemetry spans, links and metrics along a message's way: send → process, handler
sends, delayed delivery, immediate and delayed retries, the error queue, an operator's
retry, the outbox, batch handlers; and nothing at all while tracing is off."""
from __future__ import annotations

import time

import pytest
from opentelemetry import baggage, context, trace
from opentelemetry.trace import SpanKind

from core.delayed import DelayedMover, SqlDelayedStore
from core.failures import ingest_errors, retry, run_retry
from core.handlers import handlers
from core.messages import Headers
from core.monitoring import gauges
from core.tracing.propagation import span_context
from tests.conftest import drain, put_raw_row
from tests.tracing_support import ids, linked, parent_id, traced  # noqa: F401 — the fixture

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def store(transactional_db) -> SqlDelayedStore:
    s = SqlDelayedStore()
    s.setup_infrastructure()
    for message in s.list(100_000)[0]:
        s.delete(message.id)
    return s


def move_due(store: SqlDelayedStore, wait: float = 0.15) -> int:
    time.sleep(wait)
    mover = DelayedMover(store, max_sleep=0.2, elect=False)
    try:
        return mover.move_due()
    finally:
        mover.close()


def test_the_process_span_is_a_child_of_the_send_and_the_handlers_sends_nest_under_it(
        traced, transport, make_queue, pump_for, temp_handlers):
    source, target = make_queue(), make_queue()
    temp_handlers(source, "PlaceOrder", lambda m, ctx: ctx.send(target, {"bill": 1}, message_type="BillOrder"))
    message_id = transport.send(source, {"order": 1}, message_type="PlaceOrder")
    drain(pump_for(source, concurrency=1))

    send = traced.one(f"send {source}")
    process = traced.one(f"process {source}")
    onward = traced.one(f"send {target}")
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    assert parent_id(process) == send.context.span_id and process.context.trace_id == send.context.trace_id
    assert parent_id(onward) == process.context.span_id
    assert send.attributes["messaging.system"] == "sluice"
    assert send.attributes["messaging.message.id"] == message_id
    attributes = process.attributes
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == source
    assert attributes["messaging.message.id"] == message_id
    assert attributes["messaging.message.conversation_id"]
    assert attributes["sluice.attempt"] == 1
    assert attributes["sluice.batch_size"] == 1
    assert attributes["sluice.transaction_mode"] == "sends_atomic_with_receive"
    assert "error.type" not in attributes
    # The sent message carries the handler's send span: the next process span hangs from it.
    sent = transport.browse(target)[0]
    assert ids(onward) == (span_context(sent.headers).trace_id, span_context(sent.headers).span_id)

    assert traced.total("sluice.messages.processed", messaging_destination_name=source) == 1
    assert traced.total("messaging.client.consumed.messages", messaging_destination_name=source) == 1
    assert traced.total("messaging.process.duration", messaging_destination_name=source) == 1
    assert traced.total("sluice.message.critical_time", messaging_destination_name=source) == 1
    assert traced.total("messaging.client.sent.messages", messaging_destination_name=target) == 1


def test_the_process_span_never_nests_under_the_span_current_in_the_pumps_thread(
        traced, transport, queue, pump_for, temp_handlers):
    seen = []
    temp_handlers(queue, None, lambda m, ctx: seen.append(trace.get_current_span().get_span_context()))
    transport.send(queue, "x")
    tracer = traced.provider.get_tracer("celery-like")
    with tracer.start_as_current_span("run_worker_loops (a Celery task that lives for hours)") as hosting:
        drain(pump_for(queue))
    send, process = traced.one(f"send {queue}"), traced.one(f"process {queue}")
    assert parent_id(process) == send.context.span_id
    assert process.context.trace_id != hosting.get_span_context().trace_id
    assert seen == [process.context]  # the handler ran with its process span current
    assert trace.get_current_span() is trace.INVALID_SPAN  # and the thread's context came back


def test_baggage_travels_with_the_message_to_its_handler(traced, transport, queue, pump_for, temp_handlers):
    seen = []
    temp_handlers(queue, None, lambda m, ctx: seen.append(baggage.get_baggage("tenant")))
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        transport.send(queue, "x")
    finally:
        context.detach(token)
    assert transport.browse(queue)[0].headers[Headers.BAGGAGE] == "tenant=acme"
    drain(pump_for(queue))
    assert seen == ["acme"]


def test_a_message_sent_without_tracing_starts_a_new_trace(traced, transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, ctx: None)
    from core import tracing  # the switch, turned off for the send only

    telemetry = tracing.active()
    tracing.uninstall()
    transport.send(queue, "x")
    tracing.state.current = telemetry
    with traced.provider.get_tracer("host").start_as_current_span("ambient"):
        drain(pump_for(queue))
    process = traced.one(f"process {queue}")
    assert process.parent is None and not process.links


def test_a_delayed_send_starts_a_new_trace_linked_to_the_sender(traced, transport, queue, pump_for, temp_handlers,
                                                                store):
    temp_handlers(queue, None, lambda m, ctx: None)
    transport.send(queue, "later", delay=0.05)
    send = traced.one(f"send {queue}")
    assert send.attributes["sluice.delayed"] is True
    assert move_due(store) == 1
    forward = traced.one("forward delayed")
    assert forward.parent is None and linked(forward) == {ids(send)}
    drain(pump_for(queue))
    process = traced.one(f"process {queue}")
    assert process.parent is None and process.context.trace_id != send.context.trace_id
    assert linked(process) == {ids(send)}


def test_each_processing_record_keeps_the_trace_its_process_span_is_in(
        traced, transport, queue, pump_for, temp_handlers, store):
    """A first delivery's process span is in its sender's trace; a delayed delivery's is in
    a trace of its own (linked to the sender): its record names that one, so the
    conversation view leads to the processing without following links."""
    from core.models.records import ProcessingRecord

    temp_handlers(queue, None, lambda m, ctx: None)
    now_id = transport.send(queue, "now")
    later_id = transport.send(queue, "later", delay=0.05)
    assert move_due(store) == 1
    drain(pump_for(queue))
    trace_of = {s.attributes["messaging.message.id"]: f"{s.context.trace_id:032x}"
                for s in traced.spans(f"process {queue}")}
    sent_trace = {s.attributes["messaging.message.id"]: f"{s.context.trace_id:032x}"
                  for s in traced.spans(f"send {queue}")}
    recorded = {r.message_id: r.trace_id for r in ProcessingRecord.objects.filter(queue=queue)}
    assert recorded[now_id] == trace_of[now_id] == sent_trace[now_id]
    assert recorded[later_id] == trace_of[later_id] != sent_trace[later_id]


def test_with_tracing_off_a_processing_record_keeps_the_senders_trace(transport, queue, pump_for, temp_handlers,
                                                                       store, traced):
    from core import tracing
    from core.models.records import ProcessingRecord

    temp_handlers(queue, None, lambda m, ctx: None)
    later_id = transport.send(queue, "later", delay=0.05)
    [send] = traced.spans(f"send {queue}")
    tracing.uninstall()  # the worker's side traces nothing
    assert move_due(store) == 1
    drain(pump_for(queue))
    assert ProcessingRecord.objects.get(message_id=later_id).trace_id == f"{send.context.trace_id:032x}"


def test_retries_the_error_queue_and_an_operators_retry_keep_the_senders_context(
        traced, transport, queue, pump_for, temp_handlers, store, error_queue):
    fail = {"on": True}

    def handler(message, context):
        if fail["on"]:
            raise ValueError("out of stock")

    temp_handlers(queue, None, handler)
    message_id = transport.send(queue, "x", message_type="PlaceOrder")
    send = traced.one(f"send {queue}")
    pump = pump_for(queue, immediate_retries=1, delayed_retries=1, concurrency=1)
    pump.recoverability.delayed_retry_increase = 0.05
    drain(pump)  # attempt 1 → immediate retry; attempt 2 → delayed retry
    first, second = sorted(traced.spans(f"process {queue}"), key=lambda s: s.start_time)
    for span, event in ((first, "sluice.retry.immediate"), (second, "sluice.retry.delayed")):
        assert parent_id(span) == send.context.span_id  # the first round: children of the send
        assert span.attributes["error.type"] == "ValueError"
        assert [e.name for e in span.events] == [event]
        assert span.status.status_code is trace.StatusCode.ERROR
    assert [s.attributes["sluice.attempt"] for s in (first, second)] == [1, 2]

    assert move_due(store) == 1  # the delayed retry comes back...
    drain(pump)  # ...attempt 3 → immediate retry; attempt 4 → the error queue
    third, fourth = sorted(traced.spans(f"process {queue}"), key=lambda s: s.start_time)[2:]
    for span, event in ((third, "sluice.retry.immediate"), (fourth, "sluice.moved_to_error_queue")):
        assert span.parent is None and linked(span) == {ids(send)}  # a new trace, linked to the sender
        assert [e.name for e in span.events] == [event]
    assert traced.total("sluice.messages.failed", messaging_destination_name=queue) == 4
    assert traced.total("sluice.messages.retried", messaging_destination_name=queue) == 3
    assert traced.total("sluice.messages.moved_to_error", messaging_destination_name=queue) == 1
    in_error = transport.browse(error_queue)[0]
    assert span_context(in_error.headers).span_id == send.context.span_id  # kept in the error queue

    # An operator's retry keeps the context too: a new trace, linked to the sender.
    assert ingest_errors() == 1
    run_retry(retry([message_id]).pk)
    assert span_context(transport.browse(queue)[0].headers).span_id == send.context.span_id
    fail["on"] = False
    drain(pump)
    fifth = sorted(traced.spans(f"process {queue}"), key=lambda s: s.start_time)[4]
    assert fifth.parent is None and linked(fifth) == {ids(send)}
    assert "error.type" not in fifth.attributes
    assert traced.total("sluice.messages.processed", messaging_destination_name=queue) == 1


def test_a_call_whose_work_rolled_back_with_its_chunk_says_so_and_its_rerun_has_a_span_of_its_own(
        traced, transport, queue, pump_for, temp_handlers):
    """Three messages in one chunk; the second fails: the chunk's savepoint rolls back the
    first one's work, which runs again.  Its first span says it was rolled back."""
    def handler(message, context):
        if message.json() == 2:
            raise ValueError("no stock")

    temp_handlers(queue, None, handler)
    ids_by_body = {n: transport.send(queue, n) for n in (1, 2, 3)}
    drain(pump_for(queue, concurrency=1, immediate_retries=0))
    spans = traced.spans(f"process {queue}")

    def of(n):
        return sorted((s for s in spans if s.attributes["messaging.message.id"] == ids_by_body[n]),
                      key=lambda s: s.start_time)

    rolled_back, counted = of(1)
    assert rolled_back.attributes["sluice.rolled_back"] is True
    assert "sluice.rolled_back" not in counted.attributes and counted.end_time >= rolled_back.end_time
    [failed] = of(2)
    assert [e.name for e in failed.events] == ["sluice.moved_to_error_queue"]
    [third] = of(3)
    assert "sluice.rolled_back" not in third.attributes
    assert traced.total("sluice.messages.processed", messaging_destination_name=queue) == 2


@pytest.mark.django_db(transaction=True, databases="__all__")
def test_in_receive_only_mode_a_handlers_span_ends_with_the_handler_as_its_work_committed(
        traced, transport, queue, pump_for, temp_handlers, settings):
    """receive_only's handlers write on a connection of their own: their work has committed
    when they return, so their spans end then, not with the receive, and are never marked
    rolled back."""
    from django.db import connection

    if connection.vendor == "sqlite":
        pytest.skip("receive_only needs concurrent writers (refused on SQLite)")
    exported_while_handling = []

    def handler(message, context):
        exported_while_handling.append(len(traced.spans(f"process {queue}")))

    temp_handlers(queue, None, handler)
    for n in (1, 2):
        transport.send(queue, n)
    drain(pump_for(queue, concurrency=1, receive_batch_size=10, transaction_mode="receive_only"))
    spans = traced.spans(f"process {queue}")
    assert exported_while_handling == [0, 1]  # the first call's span ended before the second began
    assert [s.attributes["sluice.transaction_mode"] for s in spans] == ["receive_only"] * 2
    assert all("sluice.rolled_back" not in s.attributes for s in spans)
    assert traced.total("sluice.messages.processed", messaging_destination_name=queue) == 2


def test_a_settled_message_whose_chunk_rolled_back_says_so_too(traced, transport, queue, pump_for, temp_handlers):
    """A message no handler takes, then one whose handler fails, in one chunk: the first
    one's move to the error queue rolled back with the chunk and was done again."""
    def handler(message, context):
        raise ValueError("no stock")

    temp_handlers(queue, "Known", handler)
    unknown = transport.send(queue, "a", message_type="Unknown")
    transport.send(queue, "b", message_type="Known")
    drain(pump_for(queue, concurrency=1, immediate_retries=0))
    first, again = sorted((s for s in traced.spans(f"process {queue}")
                           if s.attributes["messaging.message.id"] == unknown), key=lambda s: s.start_time)
    assert first.attributes["sluice.rolled_back"] is True
    assert "sluice.rolled_back" not in again.attributes
    assert [e.name for e in first.events] == [e.name for e in again.events] == ["sluice.moved_to_error_queue"]


def test_outbox_dispatch_links_to_the_context_captured_when_the_record_was_written(
        traced, transport, make_queue, pump_for, temp_handlers, outbox):
    source, target = make_queue(), make_queue()
    temp_handlers(source, None, lambda m, ctx: ctx.send(target, "onward"))
    temp_handlers(target, None, lambda m, ctx: None)
    transport.send(source, "in")
    drain(pump_for(source, transaction_mode="outbox"))
    process = traced.one(f"process {source}")
    assert process.attributes["sluice.transaction_mode"] == "outbox"
    captured = traced.one(f"send {target}")
    assert parent_id(captured) == process.context.span_id
    dispatch = traced.one("dispatch outbox")
    assert dispatch.parent is None and linked(dispatch) == {ids(captured)}
    assert dispatch.attributes["sluice.outbox.table"] == outbox.store.table
    assert dispatch.attributes["sluice.outbox.records"] == 1
    drain(pump_for(target))
    assert parent_id(traced.one(f"process {target}")) == captured.context.span_id


def test_a_batch_handlers_span_links_every_message(traced, transport, queue, pump_for):
    got = []
    handlers.register(queue, "Ping", lambda messages, ctx: got.append(len(messages)), batch=True)
    try:
        for _ in range(3):
            transport.send(queue, "p", message_type="Ping")
        drain(pump_for(queue, concurrency=1))
    finally:
        handlers.unregister(queue, "Ping")
    assert got == [3]
    process = traced.one(f"process {queue}")
    assert process.parent is None and process.attributes["messaging.batch.message_count"] == 3
    assert linked(process) == {ids(s) for s in traced.spans(f"send {queue}")}
    assert traced.total("messaging.process.duration", messaging_destination_name=queue) == 3


def test_an_expired_message_and_a_message_nobody_handles_get_a_span_and_an_event(
        traced, transport, make_queue, pump_for, temp_handlers, error_queue):
    expiring, unhandled = make_queue(), make_queue()
    temp_handlers(expiring, None, lambda m, ctx: None)
    transport.send(expiring, "x", ttl=0.01)
    transport.send(unhandled, "y", message_type="Nobody")
    time.sleep(0.05)
    drain(pump_for(expiring))
    drain(pump_for(unhandled))
    [expired] = traced.one(f"process {expiring}").events
    assert (expired.name, dict(expired.attributes)) == ("sluice.expired", {"sluice.expiry.action": "dropped"})
    nobody = traced.one(f"process {unhandled}")
    assert [e.name for e in nobody.events] == ["sluice.moved_to_error_queue"]
    assert nobody.attributes["error.type"] == "core.errors.NoHandler"
    assert nobody.status.description == f"no handler on {unhandled} for message type 'Nobody'"


def test_each_message_no_handler_saw_or_that_failed_has_a_span_and_a_record_in_its_trace(
        traced, transport, make_queue, pump_for, temp_handlers, error_queue):
    """A poison row, an expired message, one nobody handles and one whose handler fails for
    the last time: each gets a process span that says what became of it, and its processing
    record names that span's trace (the conversation view leads from one to the other)."""
    from core.models.records import ProcessingRecord

    raised_at: list[int] = []

    def fails(message, context):
        raised_at.append(time.time_ns())
        raise ValueError("no stock")

    queue = make_queue()
    temp_handlers(queue, "Fails", fails)
    poison_id = put_raw_row(queue, "{not json", b"raw")  # another system's row: header text nobody can read
    expired = transport.send(queue, "x", ttl=0.01, message_type="Fails")
    nobody = transport.send(queue, "y", message_type="Nobody")
    failing = transport.send(queue, "z", message_type="Fails")
    time.sleep(0.05)
    drain(pump_for(queue, concurrency=1, immediate_retries=0))

    spans = {s.attributes["messaging.message.id"]: s for s in traced.spans(f"process {queue}")}
    assert len(spans) == 4  # one each: a failure's decision is an event on its handler's span
    records = {r.message_id: r for r in ProcessingRecord.objects.filter(queue=queue)}
    poison = spans[poison_id]
    assert [e.name for e in poison.events] == ["sluice.moved_to_error_queue"]
    assert poison.attributes["error.type"] == "core.errors.PoisonMessage"
    assert "JSON" in poison.status.description or "json" in poison.status.description
    [failed] = spans[failing].events
    assert spans[failing].start_time < raised_at[0]  # the handler's own span took the decision
    assert (failed.name, dict(failed.attributes)) == (
        "sluice.moved_to_error_queue", {"sluice.attempt": 1, "error.type": "ValueError"})
    assert {mid: r.outcome for mid, r in records.items()} == {
        poison_id: "error_queue", expired: "expired", nobody: "error_queue",
        failing: "failed"}
    for mid, record in records.items():
        assert record.trace_id == f"{spans[mid].context.trace_id:032x}", mid


def test_a_delayed_message_no_handler_saw_or_that_failed_is_recorded_in_its_own_trace(
        traced, transport, make_queue, pump_for, temp_handlers, error_queue, store):
    """A delayed delivery is processed in a trace of its own (linked to the sender's): an
    expired one, one nobody handles and one whose handler fails each have a record naming
    that trace, not the sender's."""
    from core.models.records import ProcessingRecord

    def fails(message, context):
        raise ValueError("no stock")

    queue = make_queue()
    temp_handlers(queue, "Fails", fails)
    sent = [transport.send(queue, "x", delay=0.05, ttl=0.01, message_type="Fails"),
            transport.send(queue, "y", delay=0.05, message_type="Nobody"),
            transport.send(queue, "z", delay=0.05, message_type="Fails")]
    assert move_due(store) == 3
    time.sleep(0.05)  # the first one's TTL, counted from when it was due, runs out
    drain(pump_for(queue, concurrency=1, immediate_retries=0))

    sender_trace = {s.attributes["messaging.message.id"]: f"{s.context.trace_id:032x}"
                    for s in traced.spans(f"send {queue}")}
    own_trace = {s.attributes["messaging.message.id"]: f"{s.context.trace_id:032x}"
                 for s in traced.spans(f"process {queue}")}
    records = {r.message_id: (r.outcome, r.trace_id) for r in ProcessingRecord.objects.filter(queue=queue)}
    assert records == {sent[0]: ("expired", own_trace[sent[0]]), sent[1]: ("error_queue", own_trace[sent[1]]),
                       sent[2]: ("failed", own_trace[sent[2]])}
    assert all(own_trace[mid] != sender_trace[mid] for mid in sent)


def test_queue_length_and_oldest_age_are_gauges(traced, transport, queue):
    transport.send_many(queue, ["a", "b", "c"])
    gauges.observe([queue])
    assert traced.total("sluice.queue.length", messaging_destination_name=queue) == 3
    ages = [p.value for p in traced.metrics()["sluice.queue.oldest_message_age"]
            if p.attributes["messaging.destination.name"] == queue]
    assert len(ages) == 1 and 0 <= ages[0] < 60
    send = traced.one(f"send {queue}")
    assert send.attributes["messaging.batch.message_count"] == 3
    assert len({m.headers[Headers.TRACEPARENT] for m in transport.browse(queue)}) == 1


def test_tracing_off_makes_no_spans_and_adds_no_headers(transport, queue, pump_for, temp_handlers, store):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from core import tracing

    assert tracing.active() is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    temp_handlers(queue, None, lambda m, ctx: None)
    with provider.get_tracer("app").start_as_current_span("the application's own span"):
        transport.send(queue, "x")
        transport.send(queue, "later", delay=0.05)
        assert Headers.TRACEPARENT not in transport.browse(queue)[0].headers
        move_due(store)
        drain(pump_for(queue))
    assert [s.name for s in exporter.get_finished_spans()] == ["the application's own span"]
