"""Outbox mode in chunks: a receive batch's handlers run in one savepoint per chunk and
their outbox records are inserted together, with the per-message guarantees of phase 1
kept — a failing handler loses only its own work, a copy processed before (or earlier in
the batch, or by a concurrent receiver) skips its handler, a batch handler gets one
message per call."""
from __future__ import annotations

from django.db import connections
from django.test.utils import CaptureQueriesContext

from core.demo.models import PingRecord
from core.handlers import handler, handlers
from core.outbox import OutboxStore
from core.transport import Transport
from tests.conftest import drain
from tests.test_outbox import forward_to, ids_in


def outbox_pump(pump_for, queue: str, **options):
    return pump_for(queue, transaction_mode="outbox", **options)


def test_a_batch_stores_its_records_in_one_statement(outbox, make_queue, pump_for, temp_handlers):
    source, target = make_queue(), make_queue()
    temp_handlers(source, None, forward_to(target))
    sent = Transport().send_many(source, [{"n": i} for i in range(8)])
    pump = outbox_pump(pump_for, source, receive_batch_size=8)
    with CaptureQueriesContext(connections["default"]) as queries:
        pump.receive_and_process(8)
    inserts = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("INSERT INTO")
               and outbox.store.table in q["sql"]]
    assert len(inserts) == 1, inserts
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(sent)
    assert ids_in(target) and len(ids_in(target)) == 8  # phase 2 ran after the commit
    assert (outbox.store.stats().records, outbox.store.stats().undispatched) == (8, 0)


def test_a_failing_handler_loses_only_its_own_records_and_writes(outbox, make_queue, pump_for, temp_handlers,
                                                                 error_queue):
    source, target = make_queue(), make_queue()
    forward = forward_to(target)

    def third_fails(message, context):
        forward(message, context)
        if message.json()["n"] == 3:
            raise RuntimeError("after its business write and its send")

    temp_handlers(source, None, third_fails)
    sent = Transport().send_many(source, [{"n": i} for i in range(8)])
    pump = outbox_pump(pump_for, source, receive_batch_size=8, immediate_retries=0)
    drain(pump)
    kept = [message_id for i, message_id in enumerate(sent) if i != 3]
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(kept)
    assert sorted(m.json()["n"] for m in Transport().browse(target)) == [0, 1, 2, 4, 5, 6, 7]
    assert outbox.store.record(sent[3]) is None  # its record went with its writes
    assert outbox.store.stats().records == 7
    assert pump.stats.succeeded == 7 and Transport().counts(error_queue).total == 1


def test_two_copies_in_one_batch_run_one_handler(outbox, make_queue, pump_for, temp_handlers):
    source, target = make_queue(), make_queue()
    calls: list = []
    temp_handlers(source, None, forward_to(target, calls))
    transport = Transport()
    for body in ("a", "b", "a"):
        transport.send(source, body, message_id=f"id-{body}")
    pump = outbox_pump(pump_for, source, receive_batch_size=8)
    drain(pump)
    assert sorted(calls) == [b"a", b"b"]
    assert pump.stats.duplicates == 1 and pump.stats.succeeded == 2
    assert sorted(m.body for m in transport.browse(target)) == [b"a", b"b"]


def test_a_copy_committed_after_the_look_up_makes_the_chunk_run_again(outbox, make_queue, pump_for,
                                                                      temp_handlers, monkeypatch):
    """Another receiver committed message ``twin``'s record between this batch's look-up
    of its ids and the chunk's insert: the insert conflicts, the chunk rolls back and runs
    again, and this time ``twin`` is a duplicate — the others' work counts once."""
    source, target = make_queue(), make_queue()
    calls: list = []
    temp_handlers(source, None, forward_to(target, calls))
    transport = Transport()
    for body in ("first", "twin", "last"):
        transport.send(source, body, message_id=body)
    OutboxStore().insert("twin", '{"v":1,"ops":[]}', dispatched=True)  # the other receiver's, committed
    looked_up = []
    states = OutboxStore.states

    def look_up_before_the_copy_committed(self, message_ids):
        looked_up.append(list(message_ids))
        return {} if len(looked_up) == 1 else states(self, message_ids)

    monkeypatch.setattr(OutboxStore, "states", look_up_before_the_copy_committed)
    pump = outbox_pump(pump_for, source, receive_batch_size=8)
    drain(pump)
    assert looked_up[1] == ["first", "twin", "last"]  # after the conflict: the chunk's ids
    assert calls == [b"first", b"twin", b"last", b"first", b"last"]  # twin's handler not in the run again
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == ["first", "last"]
    assert sorted(m.body for m in transport.browse(target)) == [b"first", b"last"]
    assert pump.stats.duplicates == 1 and pump.stats.succeeded == 2 and pump.stats.retried == 0


def test_a_batch_handlers_sends_are_each_in_their_messages_record(outbox, make_queue, pump_for):
    source, target = make_queue(), make_queue()
    lists: list[int] = []

    def relay_all(messages, context):
        lists.append(len(messages))
        for message in messages:
            context.send(target, message.body)

    handler(source, "Ping", batch=True)(relay_all)
    try:
        sent = Transport().send_many(source, [{"n": i} for i in range(5)], message_type="Ping")
        drain(outbox_pump(pump_for, source, receive_batch_size=8))
    finally:
        handlers.unregister(source, "Ping")
    assert lists == [1] * 5  # one call per message: one record per message
    assert all(outbox.store.record(message_id).dispatched for message_id in sent)
    forwarded = Transport().browse(target)
    assert sorted(m.json()["n"] for m in forwarded) == list(range(5))
