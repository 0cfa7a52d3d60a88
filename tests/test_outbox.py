"""The outbox: phase 1 / phase 2 in the pump, de-duplication, destinations, bad input."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from core.demo.models import PingRecord
from core.errors import ConfigurationError, InvalidMessage, InvalidTTL, UnknownQueue
from core.runtime.loops import ThreadRunner
from core.messages import Headers
from core.outbox import Outbox, OutboxDispatcher, UnknownDestination
from core.outbox import OutboxSender
from core.receive.pump import MessagePump
from core.queues import dialect
from core.transport import Transport
from tests.conftest import OTHER, drain, uses_other_database, wait_for



@pytest.fixture
def pump_for(pump_for):
    """Pumps in outbox mode unless a test says otherwise."""
    return lambda queue, **options: pump_for(queue, **{"transaction_mode": "outbox", **options})


def forward_to(target: str, calls: list | None = None, using: str | None = None):
    """A handler: one business row, one message onward."""

    def handle(message, context):
        if calls is not None:
            calls.append(message.body)
        PingRecord.objects.using(using or context.using).create(message_id=message.headers[Headers.MESSAGE_ID])
        context.send(target, message.body, message_type="Forwarded")

    return handle


def ids_in(queue: str, using: str | None = None) -> list[str]:
    return [m.headers[Headers.MESSAGE_ID] for m in Transport(using).browse(queue, limit=1000)]


def test_handler_messages_are_stored_then_dispatched_after_the_commit(outbox, make_queue, pump_for,
                                                                      temp_handlers):
    source, target = make_queue(), make_queue()
    seen_senders = []

    def handle(message, context):
        seen_senders.append(type(context.transport))
        forward_to(target)(message, context)

    temp_handlers(source, None, handle)
    sent = [Transport().send(source, {"n": i}) for i in range(5)]
    drain(pump_for(source))
    assert seen_senders == [OutboxSender] * 5  # collected, not sent, during the handler
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(sent)
    forwarded = Transport().browse(target)
    assert [m.json() for m in forwarded] == [{"n": i} for i in range(5)]
    assert {m.headers["NServiceBus.RelatedTo"] for m in forwarded} == set(sent)
    stats = outbox.store.stats()
    assert (stats.records, stats.undispatched) == (5, 0)
    # A dispatched record keeps only what de-duplication needs.
    record = outbox.store.record(sent[0])
    assert record.dispatched and record.dispatched_at is not None
    assert record.operations == '{"v":1,"ops":[]}' and record.persistence_version == "sluice-outbox-1"


def test_a_copy_of_a_processed_message_skips_its_handler(outbox, make_queue, pump_for, temp_handlers):
    """Also the documented answer to 'a message id reused with different content': the
    second is a duplicate, its handler does not run; the stored record wins."""
    source, target = make_queue(), make_queue()
    calls: list = []
    temp_handlers(source, None, forward_to(target, calls))
    transport = Transport()
    transport.send(source, {"v": "first"}, message_id="order-7")
    pump = pump_for(source)
    drain(pump)
    transport.send(source, {"v": "first"}, message_id="order-7")
    transport.send(source, {"v": "different content"}, message_id="order-7")
    drain(pump)
    assert calls == [b'{"v":"first"}']
    assert pump.stats.duplicates == 2 and pump.stats.succeeded == 1
    assert [m.json() for m in transport.browse(target)] == [{"v": "first"}]
    assert transport.counts(source).total == 0  # the copies were acknowledged


def test_a_copy_arriving_before_phase_two_ran_finishes_phase_two(outbox, make_queue, pump_for, temp_handlers,
                                                                 monkeypatch):
    source, target = make_queue(), make_queue()
    calls: list = []
    temp_handlers(source, None, forward_to(target, calls))
    transport = Transport()
    transport.send(source, "x", message_id="m-1")
    pump = pump_for(source)
    with monkeypatch.context() as patch:
        patch.setattr(pump.outbox, "after_commit", lambda ids: None)  # the process died after the commit
        drain(pump)
    assert transport.counts(target).total == 0
    assert outbox.store.stats().undispatched == 1
    transport.send(source, "x", message_id="m-1")  # e.g. the sender's outbox sent it twice
    drain(pump)
    assert len(calls) == 1 and pump.stats.duplicates == 1
    assert transport.counts(target).total == 1 and outbox.store.stats().undispatched == 0


def test_a_failed_attempt_rolls_back_business_writes_and_the_outbox_record(outbox, make_queue, pump_for,
                                                                           temp_handlers, error_queue):
    source, target = make_queue(), make_queue()

    def flaky(message, context):
        forward_to(target)(message, context)
        if context.attempt < 3:
            raise RuntimeError("after the business write and the send")

    temp_handlers(source, None, flaky)
    message_id = Transport().send(source, "x")
    pump = pump_for(source, immediate_retries=5)
    drain(pump)
    assert pump.stats.retried == 2 and pump.stats.succeeded == 1
    assert list(PingRecord.objects.values_list("message_id", flat=True)) == [message_id]
    assert Transport().counts(target).total == 1
    assert outbox.store.stats().records == 1


@pytest.mark.parametrize("control", ["optimistic", "pessimistic"])
def test_two_copies_processed_at_once_write_business_data_once(outbox, make_queue, pump_for, temp_handlers,
                                                               control):
    source, target = make_queue(), make_queue()
    calls: list = []
    lock = threading.Lock()

    def slow(message, context):
        with lock:
            calls.append(1)
        forward_to(target)(message, context)
        time.sleep(0.3)  # the other copy is received while this one is still open

    temp_handlers(source, None, slow)
    transport = Transport()
    transport.send(source, "a", message_id="twin")
    transport.send(source, "a", message_id="twin")
    pump = pump_for(source, concurrency=2, receive_batch_size=1)
    pump.outbox.pessimistic = control == "pessimistic"
    with ThreadRunner([pump]):  # its two threads receive one copy each, at once
        wait_for(lambda: pump.stats.received == 2, timeout=10, what="both copies received")
    assert PingRecord.objects.filter(message_id="twin").count() == 1
    assert transport.counts(target).total == 1
    assert pump.stats.duplicates == 1 and pump.stats.succeeded == 1
    if dialect().supports_concurrent_writers:
        # Optimistic: both handlers ran, the primary key rolled the second back.
        # Pessimistic: the second waited on the first's record and never ran.
        assert len(calls) == (2 if control == "optimistic" else 1)
    else:
        assert len(calls) == 1  # one writer at a time: the second copy saw the committed record


@uses_other_database
def test_messages_to_another_database_and_duplicates_absorbed_there(outbox, other_outbox, make_queue,
                                                                    make_other_queue, pump_for, temp_handlers,
                                                                    monkeypatch):
    source, remote = make_queue(), make_other_queue()
    temp_handlers(source, None, forward_to(f"{remote}@{OTHER}"))
    transport = Transport()
    sent = transport.send(source, {"order": 1})
    pump = pump_for(source)
    real_mark = outbox.store.mark_dispatched
    crashes = []

    def crash_once(ids, token):  # between dispatching and marking dispatched
        if not crashes:
            crashes.append(ids)
            raise RuntimeError("crash before the record was marked dispatched")
        return real_mark(ids, token)

    monkeypatch.setattr(type(pump.outbox.store), "mark_dispatched", lambda self, ids, token: crash_once(ids, token))
    pump.outbox.dispatch_lease = 0.3
    drain(pump)
    assert outbox.store.stats().undispatched == 1
    dispatcher = OutboxDispatcher(grace=0)
    deadline = time.monotonic() + 10
    while outbox.store.stats().undispatched:  # after the lease the other database gets it again
        assert time.monotonic() < deadline, "the record was not re-dispatched after its lease"
        dispatcher.step()
        time.sleep(0.05)
    arrived = ids_in(remote, OTHER)
    assert len(arrived) == 2 and arrived[0] == arrived[1]  # two copies, one message id
    assert transport.counts(source).total == 0

    # The receiving endpoint uses the outbox too: the copy is absorbed.
    received: list = []

    def receive(message, context):
        received.append(message.json())
        PingRecord.objects.using(context.using).create(message_id=message.headers[Headers.MESSAGE_ID])

    temp_handlers(remote, None, receive)
    receiver = pump_for(remote, using=OTHER)
    drain(receiver)
    assert received == [{"order": 1}] and receiver.stats.duplicates == 1
    assert PingRecord.objects.using(OTHER).filter(message_id=arrived[0]).count() == 1
    assert list(PingRecord.objects.values_list("message_id", flat=True)) == [sent]


@pytest.mark.parametrize("send, error", [
    (lambda s: s.send("no_such_queue", "x"), UnknownQueue),
    (lambda s: s.send("demo@no_such_alias", "x"), UnknownDestination),
    (lambda s: s.send("demo", "x", ttl=-1), InvalidTTL),
    (lambda s: s.send("demo", object()), InvalidMessage),
    (lambda s: s.send("demo", "x", delay=5, deliver_at=1), InvalidMessage),
    (lambda s: s.add("no_such_kind", {}), UnknownDestination),
], ids=["unknown-queue", "unknown-database", "negative-ttl", "unserializable-body", "delay-and-deliver-at",
        "unknown-destination-kind"])
def test_bad_outgoing_messages_fail_in_the_handler_and_roll_back(outbox, demo, pump_for, temp_handlers,
                                                                 error_queue, send, error):
    failures = []

    def handle(message, context):
        PingRecord.objects.using(context.using).create(message_id="rolled back")
        try:
            send(context.transport)
        except Exception as exc:
            failures.append(exc)
            raise

    temp_handlers("demo", "Bad", handle)
    Transport().send("demo", "x", message_type="Bad")
    drain(pump_for("demo", immediate_retries=0))
    assert len(failures) == 1 and isinstance(failures[0], error)
    assert not PingRecord.objects.exists()
    assert outbox.store.stats().records == 0
    assert Transport().browse(error_queue)[0].headers[Headers.EXCEPTION_MESSAGE] == str(failures[0])


def test_unserializable_operations_fail_at_send_time(outbox):
    from core.outbox import register_destination

    register_destination("test-probe", lambda op: None)
    sender = OutboxSender("default")
    with pytest.raises(InvalidMessage, match="cannot be serialized"):
        sender.add("test-probe", {"when": object()})
    with pytest.raises(InvalidMessage, match="cannot be serialized"):
        sender.add("test-probe", {"ratio": float("nan")})
    assert sender.operations == []


def test_a_record_that_cannot_be_read_is_quarantined_and_kept(outbox, queue, monkeypatch):
    from core.outbox import OutboxSession

    monkeypatch.setattr(Outbox, "after_commit", lambda self, ids: None)  # died before phase 2
    with OutboxSession(message_id="broken") as session:
        session.send(queue, "x")
    d = outbox.store.dialect
    with connections["default"].cursor() as cursor:
        cursor.execute(f'UPDATE {d.table(outbox.store.table)} SET {d.quote("Operations")} = %s', ['{"v": 1, "ops": [{'])
    report = outbox.dispatch(["broken"])
    assert report.quarantined == ["broken"] and not report.dispatched
    record = outbox.store.record("broken")
    assert record.quarantined and not record.dispatched
    assert record.last_error.startswith("quarantined: Operations is not valid JSON")
    assert outbox.store.stats().quarantined == 1
    # Never silently dropped: not by the dispatcher, not by the clean-up.
    assert OutboxDispatcher(grace=0).step() > 0 and outbox.store.record("broken").quarantined
    assert outbox.cleanup(keep_seconds=0) == 0 and outbox.store.record("broken") is not None


def test_a_dispatch_that_fails_keeps_the_record_and_its_error_until_it_succeeds(outbox, queue, make_queue,
                                                                               monkeypatch):
    from core.outbox import OutboxSession
    from core.queues import create_queue, delete_queue

    monkeypatch.setattr(Outbox, "after_commit", lambda self, ids: None)
    target = make_queue()
    with OutboxSession() as session:
        session.send(target, "x")
        session.send(queue, "y")
    delete_queue(target)  # the destination disappears before phase 2
    dispatcher = OutboxDispatcher(grace=0)
    dispatcher.step()
    record = outbox.store.records(undispatched_only=True)[0]
    assert not record.dispatched and "does not exist" in record.last_error
    assert Transport().counts(queue).total == 0  # the record's operations are all or nothing here
    create_queue(target)
    dispatcher.step()
    assert outbox.store.stats().undispatched == 0
    assert Transport().counts(target).total == 1 and Transport().counts(queue).total == 1


def test_outbox_mode_needs_the_outbox_table(transactional_db, queue, settings):
    settings.SLUICE_OUTBOX_TABLE = "sluice_outbox_never_created"
    with pytest.raises(ConfigurationError, match="sluice setup"):
        MessagePump(queue, transaction_mode="outbox")
