"""Batch handlers: ``@handler(queue, type, batch=True)`` gets the messages of its type in
a chunk as one list, so the business write can be one ``bulk_create``.  When it raises,
the pump calls it again one message at a time to find the culprit: the others' rows
commit once, the culprit takes the normal failure path."""
from __future__ import annotations

import pytest

from core.demo.models import PingRecord
from core.handlers import BatchContext, handler, handlers
from core.messages import Headers
from core.models.records import ProcessingRecord
from core.transport import Transport
from tests.conftest import drain


class Boom(RuntimeError):
    pass


@pytest.fixture
def batch_handler(queue):
    """Register a batch handler for the test only: ``batch_handler(type, fn)``."""
    added = []

    def register(message_type, fn):
        handler(queue, message_type, batch=True)(fn)
        added.append(message_type)
        return fn

    yield register
    for message_type in added:
        handlers.unregister(queue, message_type)


def test_a_batch_handler_gets_the_messages_of_its_type_as_one_list(transport, queue, pump_for, batch_handler):
    calls: list[list[int]] = []

    def store(messages, context):
        assert isinstance(context, BatchContext)
        calls.append([m.json()["n"] for m in messages])
        PingRecord.objects.using(context.using).bulk_create(PingRecord(message_id=m.id) for m in messages)

    batch_handler("Ping", store)
    ids = transport.send_many(queue, [{"n": i} for i in range(70)], message_type="Ping")
    drain(pump_for(queue, receive_batch_size=100))
    # One call per chunk, in FIFO order: while nothing fails the chunk is the whole batch.
    assert calls == [list(range(70))]
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(ids)
    outcomes = ProcessingRecord.objects.filter(queue=queue).values_list("outcome", flat=True)
    assert list(outcomes) == ["processed"] * 70


def test_a_failing_batch_handler_falls_back_to_one_message_at_a_time_and_isolates_the_culprit(
        transport, queue, pump_for, batch_handler):
    calls: list[int] = []

    def store(messages, context):
        calls.append(len(messages))
        PingRecord.objects.using(context.using).bulk_create(PingRecord(message_id=m.id) for m in messages)
        context.send(queue, {"echo": [m.json()["n"] for m in messages]}, message_type="Echo")
        if any(m.json()["n"] == 7 for m in messages):
            raise Boom("7 is bad")

    batch_handler("Ping", store)
    ids = transport.send_many(queue, [{"n": i} for i in range(20)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=20, immediate_retries=5)
    assert pump.receive_and_process(20) == 20
    # The list of 20 failed in the batch's savepoint, which rolled back.  A list does not
    # say which message failed, so the chunk runs again with one call per message up to
    # the culprit (7), whose failure is recorded; the 7 before it run again in a savepoint
    # of their own, and the ones after it go on one per call.
    assert calls == [20] + [1] * 8 + [1] * 7 + [1] * 12
    rows = list(PingRecord.objects.values_list("message_id", flat=True))
    assert sorted(rows) == sorted(set(ids) - {ids[7]})  # each other row exactly once
    left = Transport().browse(queue, limit=100)
    culprit = [m for m in left if m.headers.get(Headers.ENCLOSED_MESSAGE_TYPES) == "Ping"]
    assert [m.id for m in culprit] == [ids[7]] and culprit[0].headers[Headers.FAILED_ATTEMPTS] == "1"
    echoes = sorted(n for m in left if m.headers.get(Headers.ENCLOSED_MESSAGE_TYPES) == "Echo"
                    for n in m.json()["echo"])
    assert echoes == [n for n in range(20) if n != 7]  # sends of the rolled-back runs are gone
    assert (pump.stats.succeeded, pump.stats.retried) == (19, 1)
    outcomes = sorted(ProcessingRecord.objects.filter(queue=queue).values_list("outcome", flat=True))
    assert outcomes == ["processed"] * 19 + ["retried"]


def test_mixed_types_in_a_chunk_each_batch_handler_gets_its_own_type(transport, queue, pump_for, batch_handler,
                                                                     temp_handlers):
    seen: list[tuple[str, list[int]]] = []

    def batch_of(kind):
        def store(messages, context):
            assert {m.message_type for m in messages} == {kind}
            seen.append((kind, [m.json()["n"] for m in messages]))
        return store

    batch_handler("Apple", batch_of("Apple"))
    batch_handler("Pear", batch_of("Pear"))
    singles: list[int] = []
    temp_handlers(queue, "Plum", lambda m, c: singles.append(m.json()["n"]))
    transport = Transport()
    for n in range(12):
        transport.send(queue, {"n": n}, message_type=("Apple", "Pear", "Plum")[n % 3])
    drain(pump_for(queue, receive_batch_size=100))
    assert sorted(seen) == [("Apple", [0, 3, 6, 9]), ("Pear", [1, 4, 7, 10])]
    assert singles == [2, 5, 8, 11]


def test_context_for_message_keeps_each_messages_conversation(transport, queue, make_queue, pump_for,
                                                              batch_handler):
    target = make_queue()

    def forward(messages, context):
        for message in messages:
            context.for_message(message).send(target, {"from": message.id}, message_type="Forwarded")

    batch_handler("Ping", forward)
    first = transport.send(queue, "a", message_type="Ping", headers={Headers.CONVERSATION_ID: "c-1"})
    transport.send(queue, "b", message_type="Ping", headers={Headers.CONVERSATION_ID: "c-2"})
    drain(pump_for(queue))
    forwarded = Transport().browse(target)
    assert [m.headers[Headers.CONVERSATION_ID] for m in forwarded] == ["c-1", "c-2"]
    assert forwarded[0].headers["NServiceBus.RelatedTo"] == first


def test_in_outbox_mode_a_batch_handler_is_called_one_message_at_a_time(outbox, transport, queue, pump_for,
                                                                        batch_handler):
    calls: list[int] = []

    def store(messages, context):
        calls.append(len(messages))
        PingRecord.objects.using(context.using).bulk_create(PingRecord(message_id=m.id) for m in messages)

    batch_handler("Ping", store)
    transport.send_many(queue, ["x", "y", "z"], message_type="Ping")
    drain(pump_for(queue, transaction_mode="outbox"))
    assert calls == [1, 1, 1] and PingRecord.objects.count() == 3
