"""The message pump: handlers, transaction modes, retries, error queue, poison rows, expiry."""
from __future__ import annotations

import random

import pytest
from django.db import connection

from core.conf import get_settings
from core.demo.models import PingRecord
from core.errors import ConfigurationError
from core.messages import Headers
from core.models.records import ProcessingRecord
from core.receive.pump import MessagePump
from core.queues import dialect
from tests.conftest import drain, listening, put_raw_row


def test_handler_gets_each_message(transport, queue, pump_for, temp_handlers):
    seen = []
    temp_handlers(queue, "Order", lambda m, ctx: seen.append(m.json()["n"]))
    for i in range(20):
        transport.send(queue, {"n": i}, message_type="Order")
    drain(pump_for(queue, concurrency=1))
    assert seen == list(range(20))
    assert transport.counts(queue).total == 0


def test_sends_from_a_handler_commit_with_the_receive(transport, make_queue, pump_for, temp_handlers,
                                                      error_queue):
    source, target = make_queue(), make_queue()

    def forward(message, context):
        context.send(target, message.body, message_type="Forwarded")
        if message.json()["fail"]:
            raise RuntimeError("after sending")

    temp_handlers(source, None, forward)
    transport.send(source, {"fail": False})
    transport.send(source, {"fail": True})
    drain(pump_for(source, immediate_retries=2))
    forwarded = transport.browse(target)
    # The failing handler's send was rolled back each time: only the good one went out.
    assert [m.json() for m in forwarded] == [{"fail": False}]
    assert forwarded[0].headers["NServiceBus.RelatedTo"]
    assert transport.counts(error_queue).total == 1


def test_failure_counts_are_stored_in_the_row_and_survive_a_new_pump(transport, queue, pump_for,
                                                                    temp_handlers, error_queue):
    attempts = []

    def flaky(message, context):
        attempts.append(context.attempt)
        raise ValueError("nope")

    temp_handlers(queue, None, flaky)
    transport.send(queue, "x")
    pump_for(queue, immediate_retries=3).receive_and_process(1)
    assert transport.browse(queue)[0].headers[Headers.FAILED_ATTEMPTS] == "1"
    # A different pump (another worker, or this one after a restart) carries on the count.
    drain(pump_for(queue, immediate_retries=3))
    assert attempts == [1, 2, 3, 4]
    failed = transport.browse(error_queue)
    assert len(failed) == 1
    headers = failed[0].headers
    assert headers[Headers.FAILED_ATTEMPTS] == "4"
    assert headers[Headers.EXCEPTION_TYPE] == "ValueError"
    assert headers[Headers.EXCEPTION_MESSAGE] == "nope"
    assert "flaky" in headers[Headers.EXCEPTION_STACK_TRACE]
    assert headers[Headers.EXCEPTION_SOURCE] == "flaky"
    assert headers[Headers.FAILED_Q] == queue
    assert headers[Headers.TIME_OF_FAILURE].endswith(" Z")
    assert failed[0].body == b"x" and failed[0].expires is None


def test_zero_immediate_retries_goes_straight_to_the_error_queue(transport, queue, pump_for, temp_handlers,
                                                                error_queue):
    calls = []
    temp_handlers(queue, None, lambda m, c: calls.append(1) or 1 / 0)
    transport.send(queue, "x")
    drain(pump_for(queue, immediate_retries=0))
    assert calls == [1]
    assert transport.browse(error_queue)[0].headers[Headers.EXCEPTION_TYPE] == "ZeroDivisionError"


def test_a_message_without_a_handler_goes_to_the_error_queue(transport, queue, pump_for, error_queue):
    transport.send(queue, "x", message_type="Unknown")
    drain(pump_for(queue))
    failed = transport.browse(error_queue)[0]
    assert failed.headers[Headers.EXCEPTION_TYPE] == "core.errors.NoHandler"


def test_a_poison_row_goes_to_the_error_queue_raw_and_does_not_block(transport, queue, pump_for,
                                                                    temp_handlers, error_queue, caplog):
    handled = []
    temp_handlers(queue, None, lambda m, c: handled.append(m.body))
    d = dialect()
    with connection.cursor() as cursor:
        # Another system wrote a row with broken header JSON.
        cursor.execute(d.insert_with_expires(queue),
                       ["0b5e3c1e-0000-4000-8000-000000000001", None, None, None, "{not json", b"\x00raw"])
    transport.send(queue, "after")
    with caplog.at_level("ERROR", logger="sluice.recoverability"):
        drain(pump_for(queue))
    assert handled == [b"after"]
    poison = transport.browse(error_queue)[0]
    assert poison.body == b"\x00raw"
    assert poison.headers[Headers.RAW_HEADERS] == "{not json"
    assert poison.headers[Headers.EXCEPTION_TYPE] == "core.errors.PoisonMessage"
    assert poison.headers[Headers.FAILED_Q] == queue
    why = poison.headers[Headers.EXCEPTION_MESSAGE]  # why its headers cannot be read
    assert "JSON" in why or "json" in why, why
    [logged] = [r.getMessage() for r in caplog.records if r.name == "sluice.recoverability"]
    assert logged == f"poison message {poison.id} on {queue} moved to {error_queue}: {why}"


def test_expired_messages_never_reach_a_handler(transport, queue, pump_for, temp_handlers):
    handled = []
    temp_handlers(queue, None, lambda m, c: handled.append(m.body))
    transport.send(queue, "expired", ttl=0)
    transport.send(queue, "live", ttl=3600)
    pump = pump_for(queue)
    drain(pump)
    assert handled == [b"live"]
    assert pump.stats.expired == 1
    assert sorted(ProcessingRecord.objects.filter(queue=queue).values_list("outcome", flat=True)) == [
        "expired", "processed"]


def test_expired_messages_are_dead_lettered_when_the_queue_says_so(transport, make_queue, pump_for,
                                                                   temp_handlers):
    name = make_queue(dead_letter_on_expiry=True)
    temp_handlers(name, None, lambda m, c: None)
    transport.send(name, "too late", ttl=0)
    drain(pump_for(name))
    dead = transport.browse(name + ".deadletter")
    assert [m.body for m in dead] == [b"too late"]
    assert dead[0].headers[Headers.EXPIRED_REASON] == "TTLExpiredException"
    # Its processing record says where it went (a dropped one says "expired").
    assert list(ProcessingRecord.objects.filter(queue=name).values_list("outcome", flat=True)) == ["dead_lettered"]


def test_max_records_to_peek_really_caps_one_receive(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, c: None)
    for i in range(30):
        transport.send(queue, str(i))
    pump = pump_for(queue, max_records_to_peek=7, receive_batch_size=50, concurrency=2)
    assert pump.step() == 0  # a full receive: more may wait, receive again at once
    assert pump.stats.received == 7
    assert transport.counts(queue).total == 23
    assert pump.step() == 0 and pump.stats.received == 14


def test_a_thread_receives_full_batches_back_to_back_and_waits_after_a_short_one(
        transport, queue, pump_for, temp_handlers):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from core.dialects import dialect_for

    temp_handlers(queue, None, lambda m, c: None)
    transport.send_many(queue, [str(i) for i in range(25)])
    pump = pump_for(queue, receive_batch_size=10, peek_delay=7)
    listening(pump)
    with CaptureQueriesContext(connection) as queries:
        assert [pump.step(), pump.step(), pump.step()] == [0, 0, 7]  # 10, 10, then 5: short, wait
    assert pump.stats.received == 25
    # One peek, when the thread started; none between full batches.
    d = dialect_for(connection)
    peek = {d.peek_estimate(queue), d.peek_range(queue)}  # the latter where receives start at a mark
    if d.supports_receive_mark:
        peek.add(d.peek_range(queue, from_mark=True))
    peeks = [q for q in queries.captured_queries if q["sql"] in peek]
    assert len(peeks) == 1
    assert pump.step() == 7  # idle: peeks (no receive) and waits the peek delay


def test_peek_delay_rules(transactional_db, queue, caplog):
    with pytest.raises(ConfigurationError, match="10 ms"):
        MessagePump(queue, peek_delay=0.005)
    pump = MessagePump(queue, peek_delay=11, delayed_retries=0)
    try:
        assert "messages may back up" in caplog.text
        listening(pump)  # or its connect's wake-up makes the step rightly go round again at once
        assert pump.step() == 11  # empty queue: wait the peek delay
    finally:
        pump.close()


def test_exactly_once_with_injected_failures(demo, transport, pump_for, temp_handlers):
    """Ping writes its row, then (sometimes) the handler fails: the row rolls back with it."""
    rng = random.Random(7)
    from core.demo.handlers import ping

    def failing_ping(message, context):
        ping(message, context)
        if rng.random() < 0.3:
            raise RuntimeError("injected failure after the business write")

    temp_handlers("demo", "PingFlaky", failing_ping)
    ids = [transport.send("demo", {"n": i}, message_type="PingFlaky") for i in range(60)]
    drain(pump_for("demo", concurrency=3, immediate_retries=20))
    rows = list(PingRecord.objects.values_list("message_id", flat=True))
    assert sorted(rows) == sorted(ids)  # one row per message: none lost, none doubled


def test_demo_handlers(demo, transport, pump_for, error_queue, settings):
    settings.SLUICE_IMMEDIATE_RETRIES = 2
    settings.SLUICE_DELAYED_RETRIES = 0
    ping_id = transport.send("demo", {}, message_type="Ping")
    transport.send("demo", {}, message_type="FailOnce")
    fail_id = transport.send("demo", {}, message_type="Fail")
    transport.send("demo", {"seconds": 0.01}, message_type="Slow")
    pump = pump_for("demo", concurrency=1)
    drain(pump)
    assert list(PingRecord.objects.values_list("message_id", flat=True)) == [ping_id]
    failed = transport.browse(error_queue)
    assert [m.headers[Headers.MESSAGE_ID] for m in failed] == [fail_id]
    assert pump.stats.succeeded == 3 and pump.stats.retried == 3


def test_receive_only_is_refused_on_sqlite(transactional_db, queue):
    if dialect().supports_concurrent_writers:
        pytest.skip("this database allows concurrent writers")
    with pytest.raises(ConfigurationError, match="SQLite"):
        MessagePump(queue, transaction_mode="receive_only")


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_receive_only_keeps_business_writes_of_a_failed_attempt(demo, transport, pump_for, temp_handlers):
    """receive_only: the handler's writes are its own (at-least-once), the receive rolls back."""
    from core.demo.handlers import ping

    def ping_then_fail_once(message, context):
        ping(message, context)
        if context.attempt == 1:
            raise RuntimeError("fail after writing")

    temp_handlers("demo", "PingTwice", ping_then_fail_once)
    message_id = transport.send("demo", {}, message_type="PingTwice")
    drain(pump_for("demo", transaction_mode="receive_only", using=get_settings().DATABASE))
    assert PingRecord.objects.filter(message_id=message_id).count() == 2


def test_graceful_stop_finishes_the_current_batch(transport, queue, pump_for, temp_handlers):
    import threading

    started = threading.Event()
    release = threading.Event()

    def slow(message, context):
        started.set()
        release.wait(10)

    temp_handlers(queue, None, slow)
    for i in range(5):
        transport.send(queue, str(i))
    pump = pump_for(queue, concurrency=1, receive_batch_size=1)
    worker = threading.Thread(target=pump.step)
    worker.start()
    assert started.wait(10)
    pump.stop()
    release.set()
    worker.join(10)
    # The in-flight message finished and committed; no new batch was taken.
    assert pump.stats.succeeded == 1
    assert transport.counts(queue).total == 4


def test_each_transaction_mode_is_its_own_strategy_and_an_unknown_one_is_refused(transactional_db, queue):
    from core.receive.transaction_modes import SendsAtomicWithReceive

    pump = MessagePump(queue, transaction_mode="sends_atomic_with_receive", peek_delay=0.1)
    try:
        assert isinstance(pump.strategy, SendsAtomicWithReceive) and pump.outbox is None
        assert pump.receive_alias == pump.business_alias  # sends share the receive's transaction
    finally:
        pump.close()
    with pytest.raises(ConfigurationError, match="unknown transaction mode 'bogus'"):
        MessagePump(queue, transaction_mode="bogus")



# -- recoverability: failure hooks, a message type's own retry limits, error-queue headers ------

def test_a_failure_hook_hears_each_failed_attempt_inside_the_receive(transport, queue, pump_for, temp_handlers,
                                                                     error_queue):
    """A message type's failure hook (the tasks' result rows use one) hears every failed
    attempt with the message, the exception, where the message went and the receive's
    alias; what it writes commits with the receive."""
    from core.handlers import handlers

    heard = []

    def hook(message, exc, outcome, using):
        heard.append((message.id, type(exc).__name__, str(exc), outcome, using))
        PingRecord.objects.using(using).create(message_id=f"{message.id}-{len(heard)}")

    temp_handlers(queue, "Hooked", lambda message, context: 1 / 0)
    handlers.on_failure(queue, "Hooked", hook)
    sent = transport.send(queue, "x", message_type="Hooked")
    drain(pump_for(queue, immediate_retries=1))

    why = "division by zero"
    assert heard == [(sent, "ZeroDivisionError", why, "retry", "default"),
                     (sent, "ZeroDivisionError", why, "error", "default")]
    assert PingRecord.objects.filter(message_id__startswith=sent).count() == 2
    assert transport.counts(error_queue).total == 1


def test_a_failure_hook_that_raises_costs_only_its_own_record(transport, queue, pump_for, temp_handlers,
                                                              error_queue, caplog):
    from core.handlers import handlers

    def hook(message, exc, outcome, using):
        PingRecord.objects.using(using).create(message_id=f"hook-{message.id}")
        raise RuntimeError("the hook is broken")

    temp_handlers(queue, "Hooked", lambda message, context: 1 / 0)
    handlers.on_failure(queue, "Hooked", hook)
    sent = transport.send(queue, "x", message_type="Hooked")
    with caplog.at_level("ERROR", logger="sluice.recoverability"):
        drain(pump_for(queue, immediate_retries=0))

    assert transport.counts(error_queue).total == 1  # the move stands
    assert not PingRecord.objects.filter(message_id=f"hook-{sent}").exists()  # the hook's write rolled back
    [logged] = [r for r in caplog.records if "failure hook" in r.getMessage()]
    assert logged.getMessage() == f"the failure hook for message {sent} on {queue} failed"
    assert logged.exc_info[0] is RuntimeError


@pytest.mark.parametrize("limits, attempts", [((0, 0), 1), ((2, None), 3), ((None, None), 2)])
def test_a_message_types_own_retry_limits_replace_the_pumps(transport, queue, pump_for, temp_handlers, error_queue,
                                                           limits, attempts):
    """Retry limits a message type gives its messages (a task's ``immediate_retries``) win
    over the pump's; None keeps the pump's."""
    from core.handlers import handlers

    runs = []
    temp_handlers(queue, "Counted", lambda message, context: runs.append(1) or 1 / 0)
    seen = []
    handlers.on_retry_limits(queue, "Counted", lambda message: seen.append(message.id) or limits)
    sent = transport.send(queue, "x", message_type="Counted")
    drain(pump_for(queue, immediate_retries=1))

    assert len(runs) == attempts and set(seen) == {sent}
    [failed] = transport.browse(error_queue)
    assert failed.headers[Headers.FAILED_ATTEMPTS] == str(attempts)


def test_a_message_with_no_handler_goes_to_a_missing_error_queue_with_its_count_and_without_its_ttl(
        transport, queue, pump_for, error_queue):
    """No handler for its type: to the error queue at once, counted as one failed attempt,
    its TTL and any DelayedDestination another endpoint wrote dropped (an operator's retry
    must not expire or go elsewhere); an error queue found missing is recreated as one."""
    from core.models import QueueKind
    from core.queues import delete_queue, registry

    message = transport.outgoing(queue, "no-handler-1", {
        Headers.MESSAGE_ID: "no-handler-1", Headers.ENCLOSED_MESSAGE_TYPES: "Nobody",
        Headers.DELAYED_DESTINATION: "elsewhere"}, b"{}", ttl=3600)
    transport.enqueue([message])
    delete_queue(error_queue)  # dropped by hand
    drain(pump_for(queue))

    [failed] = transport.browse(error_queue)
    assert failed.headers[Headers.MESSAGE_ID] == "no-handler-1"
    assert failed.headers[Headers.FAILED_ATTEMPTS] == "1"
    assert Headers.TIME_TO_BE_RECEIVED not in failed.headers and failed.expires is None
    assert Headers.DELAYED_DESTINATION not in failed.headers
    registry.forget(error_queue)
    assert registry.get(error_queue).kind == QueueKind.ERROR


def test_a_wake_up_no_idle_thread_hears_makes_the_next_short_step_step_again_at_once(transport, queue, pump_for,
                                                                                  temp_handlers):
    """A wake-up that comes while the pump's only thread is busy (here: the commit of a
    message its own handler sent) is not lost: that step, short as it is, asks to step
    again at once instead of waiting its peek delay."""
    handled: list[bytes] = []

    def handler(message, context):
        handled.append(message.body)
        if message.body == b"first":
            context.send(queue, "second")

    temp_handlers(queue, None, handler)
    pump = pump_for(queue, concurrency=1, peek_delay=5)
    listening(pump)
    assert 5 in (pump.step(), pump.step())  # an empty queue: the thread waits
    transport.send(queue, "first")  # its commit rouses the idle thread: no peek first
    assert pump.step() == 0.0  # received 1 of 10, but "second" was committed meanwhile
    assert handled == [b"first"]
    pump.step()
    assert handled == [b"first", b"second"]


def test_in_outbox_mode_each_message_is_settled_or_handled_on_its_own(transport, queue, pump_for, temp_handlers,
                                                                      error_queue, outbox):
    """Outside chunks (outbox mode, receive_only) the pump takes each message on its own: a
    poison row and an expired message never reach the handler every type has, and a batch
    handler is called with one message at a time."""
    from core.handlers import handlers

    handled: list[bytes] = []
    batches: list[list[bytes]] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.body))
    handlers.register(queue, "Batch", lambda messages, context: batches.append([m.body for m in messages]),
                      batch=True)
    try:
        put_raw_row(queue, "{not json", b"raw")  # another system's row: header text nobody can read
        transport.send(queue, "too late", ttl=0)
        transport.send(queue, "b1", message_type="Batch")
        transport.send(queue, "b2", message_type="Batch")
        transport.send(queue, "plain")
        pump = pump_for(queue, transaction_mode="outbox", concurrency=1)
        drain(pump)
    finally:
        handlers.unregister(queue, "Batch")
    assert handled == [b"plain"]
    assert batches == [[b"b1"], [b"b2"]]
    assert pump.stats.expired == 1
    [poison] = transport.browse(error_queue)
    assert poison.headers[Headers.EXCEPTION_TYPE] == "core.errors.PoisonMessage"
