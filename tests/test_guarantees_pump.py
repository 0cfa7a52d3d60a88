"""Issue 18's guarantees on the pump's transaction path (defects 1, 2, 4, 5, 6).

1. A handler's sends follow Django's savepoints: what it sends inside an atomic block
   that rolls back is not sent — in a batch run in one savepoint, in smaller chunks,
   from batch handlers, in outbox mode and from an OutboxSession.
2. Sends the database refuses fail their own message (retries, then the error queue),
   never the batch.
4–6. A failed attempt is counted on the message's row in the transaction that received
   it: whichever process takes the row next continues from the right attempt; nothing
   of a failure (no traceback, no batch) is kept in memory.
"""
from __future__ import annotations

import gc
import logging
import threading
import weakref

import pytest
from django.db import DatabaseError, connection, transaction

from core.demo.models import PingRecord
from core.runtime.loops import ThreadRunner
from core.messages import Headers
from core.outbox import OutboxSession
from core.records import writer
from core.transport import Transport
from tests.conftest import wait_for


class Rollback(Exception):
    pass


class Boom(RuntimeError):
    pass


def sent(queue: str) -> list[int]:
    return sorted(m.json()["n"] for m in Transport().browse(queue, limit=1000))


def send_then_roll_back(context, out: str, n: int) -> None:
    """Send ``n`` (kept), then ``n + 1000`` inside an atomic block that rolls back, then
    ``n + 2000`` in an inner block that commits inside an outer one that rolls back."""
    context.send(out, {"n": n})
    try:
        with transaction.atomic(using=context.using):
            context.send(out, {"n": n + 1000})
            raise Rollback
    except Rollback:
        pass
    try:
        with transaction.atomic(using=context.using):
            with transaction.atomic(using=context.using):
                context.send(out, {"n": n + 2000})
            raise Rollback
    except Rollback:
        pass


# -- 1: sends follow the handler's savepoints ------------------------------------------
@pytest.mark.parametrize("chunk", [8, 2])
def test_sends_inside_a_rolled_back_atomic_block_are_not_sent(chunk, transport, make_queue, pump_for,
                                                            temp_handlers):
    queue, out = make_queue(), make_queue()

    def handle(message, context):
        n = message.json()["n"]
        send_then_roll_back(context, out, n)
        if n == 5 and context.attempt == 1:
            raise Boom("5 fails once")  # the chunk rolls back and runs again around it

    temp_handlers(queue, "Ping", handle)
    transport.send_many(queue, [{"n": i} for i in range(8)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=8, concurrency=1, immediate_retries=3)
    pump.chunk_size.current = chunk
    assert pump.receive_and_process(8) == 8
    assert sent(out) == [0, 1, 2, 3, 4, 6, 7]
    assert pump.receive_and_process(8) == 1
    assert sent(out) == list(range(8))


def test_a_batch_handlers_sends_follow_its_savepoints(transport, make_queue, pump_for, temp_handlers):
    queue, out = make_queue(), make_queue()

    def handle(messages, context):
        assert [m.id for m in context.messages] == [m.id for m in messages]  # the batch's, for the handler
        for message in messages:
            send_then_roll_back(context, out, message.json()["n"])

    from core.handlers import handlers
    handlers.register(queue, "Ping", handle, batch=True)
    try:
        transport.send_many(queue, [{"n": i} for i in range(6)], message_type="Ping")
        pump = pump_for(queue, receive_batch_size=6, concurrency=1)
        assert pump.receive_and_process(6) == 6
    finally:
        handlers.unregister(queue, "Ping")
    assert sent(out) == list(range(6))


def test_outbox_mode_drops_what_a_rolled_back_block_sent(transport, make_queue, pump_for, temp_handlers,
                                                        outbox):
    queue, out = make_queue(), make_queue()
    temp_handlers(queue, "Ping", lambda message, context: send_then_roll_back(context, out,
                                                                              message.json()["n"]))
    transport.send_many(queue, [{"n": i} for i in range(4)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=4, concurrency=1, transaction_mode="outbox")
    assert pump.receive_and_process(4) == 4  # phase 2 runs after the commit
    assert sent(out) == list(range(4))


def test_an_outbox_session_drops_what_a_rolled_back_block_sent(make_queue, outbox):
    out = make_queue()
    with transaction.atomic(), OutboxSession() as session:
        session.send(out, {"n": 1})
        try:
            with transaction.atomic():
                session.send(out, {"n": 1001})
                raise Rollback
        except Rollback:
            pass
    assert sent(out) == [1]


def test_a_failed_savepoint_free_block_rolls_back_with_the_block_around_it(transport, make_queue, pump_for,
                                                                         temp_handlers):
    # Django's atomic(savepoint=False): its failure marks the enclosing block for rollback.
    queue, out = make_queue(), make_queue()
    seen = []

    def handle(message, context):
        n = message.json()["n"]
        seen.append((n, context.attempt))
        context.send(out, {"n": n})
        with transaction.atomic(using=context.using):  # rolled back: the inner block failed
            try:
                with transaction.atomic(using=context.using, savepoint=False):
                    context.send(out, {"n": n + 1000})
                    raise Rollback
            except Rollback:
                pass
        if n == 2 and context.attempt == 1:
            try:  # swallowed with no savepoint around it: this handler's run cannot commit
                with transaction.atomic(using=context.using, savepoint=False):
                    context.send(out, {"n": n + 3000})
                    raise Rollback
            except Rollback:
                pass

    temp_handlers(queue, "Ping", handle)
    transport.send_many(queue, [{"n": i} for i in range(4)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=4, concurrency=1, immediate_retries=3)
    assert pump.receive_and_process(4) == 4
    assert sent(out) == [0, 1, 3]
    assert (pump.stats.succeeded, pump.stats.retried) == (3, 1)  # 2's run failed, not 3's
    assert (3, 1) in seen and (3, 2) not in seen
    assert pump.receive_and_process(4) == 1
    assert sent(out) == [0, 1, 2, 3]


# -- 2: a refused send fails its own message ---------------------------------------------
def refuse_correlation_id(queue: str, value: str) -> None:
    """A database-side rule a send can break that no validation at send() can see: a
    trigger on ``queue``'s table refusing rows whose CorrelationId is ``value``."""
    table = Transport().dialect.table(queue)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"""CREATE OR REPLACE FUNCTION refuse_{queue}() RETURNS trigger AS $$
                BEGIN IF NEW."CorrelationId" = '{value}' THEN RAISE EXCEPTION 'refused by a trigger'; END IF;
                RETURN NEW; END $$ LANGUAGE plpgsql""")
            cursor.execute(f"CREATE TRIGGER refuse_{queue} BEFORE INSERT ON {table} "
                           f"FOR EACH ROW EXECUTE FUNCTION refuse_{queue}()")
        else:
            cursor.execute(f"""CREATE TRIGGER refuse_{queue} BEFORE INSERT ON {table}
                WHEN NEW."CorrelationId" = '{value}' BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END""")


@pytest.mark.parametrize("handler_kind", ["single", "batch"])
def test_a_send_the_database_refuses_fails_its_own_message_not_the_batch(
        handler_kind, transport, make_queue, error_queue, pump_for):
    queue, out = make_queue(), make_queue()
    refuse_correlation_id(out, "refuse-me")
    runs: dict[int, list[int]] = {}

    def send_for(message, context):
        n = message.json()["n"]
        runs.setdefault(n, []).append(context.attempt if handler_kind == "single" else 0)
        PingRecord.objects.using(context.using).create(message_id=message.id)
        context.send(out, {"n": n}, correlation_id="refuse-me" if n == 7 else None)

    def batch(messages, context):
        for message in messages:
            send_for(message, context)

    from core.handlers import handlers
    handlers.register(queue, "Ping", send_for if handler_kind == "single" else batch,
                      batch=handler_kind == "batch")
    try:
        ids = transport.send_many(queue, [{"n": i} for i in range(20)], message_type="Ping")
        pump = pump_for(queue, receive_batch_size=20, concurrency=1, immediate_retries=2)
        for _ in range(3):  # the first attempt and two immediate retries
            pump.receive_and_process(20)
    finally:
        handlers.unregister(queue, "Ping")
    assert sent(out) == [n for n in range(20) if n != 7]
    assert set(PingRecord.objects.values_list("message_id", flat=True)) == set(ids) - {ids[7]}
    assert transport.browse(queue, limit=100) == []
    [failed] = transport.browse(error_queue, limit=10)
    assert failed.id == ids[7] and failed.headers[Headers.FAILED_ATTEMPTS] == "3"
    assert "refused by a trigger" in failed.headers[Headers.EXCEPTION_MESSAGE]
    assert failed.headers[Headers.FAILED_Q] == queue
    assert (pump.stats.succeeded, pump.stats.retried, pump.stats.errored) == (19, 2, 1)
    if handler_kind == "single":
        assert runs[7] == [1, 1, 2, 3]  # in the batch, then alone; its retries come alone
        assert all(runs[n] == [1, 1] for n in range(20) if n != 7)


def test_a_send_to_a_queue_whose_table_was_dropped_fails_its_own_message(
        transport, make_queue, error_queue, pump_for, temp_handlers):
    queue, out, gone = make_queue(), make_queue(), make_queue()

    def handle(message, context):
        n = message.json()["n"]
        context.send(gone if n == 3 else out, {"n": n})

    temp_handlers(queue, "Ping", handle)
    ids = transport.send_many(queue, [{"n": i} for i in range(10)], message_type="Ping")
    transport.send(gone, {"n": -1})  # the registry knows the queue ...
    with connection.cursor() as cursor:  # ... whose table then goes behind its back
        cursor.execute(f"DROP TABLE {transport.dialect.table(gone)}")
    pump = pump_for(queue, receive_batch_size=10, concurrency=1, immediate_retries=0)
    assert pump.receive_and_process(10) == 10
    assert sent(out) == [n for n in range(10) if n != 3]
    [failed] = transport.browse(error_queue, limit=10)
    assert failed.id == ids[3] and failed.headers[Headers.FAILED_Q] == queue
    assert (pump.stats.succeeded, pump.stats.errored) == (9, 1)


@pytest.mark.postgresql
def test_an_over_long_correlation_id_fails_its_message_instead_of_stalling_the_queue(
        transport, make_queue, error_queue, pump_for, temp_handlers):
    # The reproduction: varchar(255) refuses it at the flush.
    queue, out = make_queue(), make_queue()

    def handle(message, context):
        n = message.json()["n"]
        context.send(out, {"n": n}, correlation_id="x" * 300 if n == 3 else None)

    temp_handlers(queue, "Ping", handle)
    ids = transport.send_many(queue, [{"n": i} for i in range(20)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=20, concurrency=1, immediate_retries=1)
    for _ in range(2):
        pump.receive_and_process(20)
    assert sent(out) == [n for n in range(20) if n != 3]
    assert [m.id for m in transport.browse(error_queue, limit=10)] == [ids[3]]
    assert transport.browse(queue, limit=100) == []


# -- 4-6: attempts are counted on the row --------------------------------------------------
def test_two_pumps_count_each_attempt_once_whichever_takes_the_row(
        transport, queue, error_queue, pump_for, temp_handlers):
    # Two pumps with their own connections and threads stand in for two worker processes
    # (on SQLite they take turns at the write lock, as two processes would).
    attempts: dict[int, list[int]] = {}
    lock = threading.Lock()
    seen: list[weakref.ref] = []

    def handle(message, context):
        n = message.json()["n"]
        with lock:
            attempts.setdefault(n, []).append(context.attempt)
            seen.append(weakref.ref(message))
        if n % 10 == 0:
            raise Boom(f"{n} always fails")

    temp_handlers(queue, "Ping", handle)
    for start in range(0, 200, 20):  # in small sends: many small batches
        transport.send_many(queue, [{"n": n} for n in range(start, start + 20)], message_type="Ping")
    pumps = [pump_for(queue, receive_batch_size=4, concurrency=2, immediate_retries=2) for _ in range(2)]
    # (Log records keep their arguments, the exceptions among them: pytest's capture of
    # them must not stand in for the engine keeping a failure's batch alive.)
    logging.disable(logging.ERROR)
    try:
        with ThreadRunner(pumps):
            wait_for(lambda: transport.counts(error_queue).total == 20 and transport.counts(queue).total == 0,
                     timeout=60, what="20 in the error queue")
    finally:
        logging.disable(logging.NOTSET)
    assert {n: runs for n, runs in attempts.items() if n % 10 == 0} == {n: [1, 2, 3] for n in range(0, 200, 10)}
    for failed in transport.browse(error_queue, limit=100):
        assert failed.headers[Headers.FAILED_ATTEMPTS] == "3"
    assert sum(p.stats.errored for p in pumps) == 20 and sum(p.stats.retried for p in pumps) == 40
    # 5: nothing of a failure is kept in memory (no traceback holding its batch).
    with lock:
        gc.collect()
        assert not [ref for ref in seen if ref() is not None]


def test_a_counted_failure_survives_a_later_transaction_failing_for_another_reason(
        transport, queue, pump_for, temp_handlers, monkeypatch):
    # The first receive after the handler failed ends in a database error (its records
    # write): the failed attempt stays counted — the handler never runs attempt 1 twice.
    attempts: list[int] = []
    armed = {"receive": False, "write": False}

    def handle(message, context):
        attempts.append(context.attempt)
        if context.attempt == 1:
            armed["receive"] = True
            raise Boom("the first attempt fails")

    temp_handlers(queue, "Ping", handle)
    transport.send(queue, {"n": 0}, message_type="Ping")
    pump = pump_for(queue, receive_batch_size=4, concurrency=1, immediate_retries=3)
    real_receive, real_write = pump.receiver.receive_batch, writer.RecordBatch.write

    def receive_batch(queue, limit):
        if armed["receive"]:
            armed["receive"], armed["write"] = False, True
        return real_receive(queue, limit)

    def write(self, alias):
        if armed["write"]:
            armed["write"] = False
            raise DatabaseError("the records write fails once")
        return real_write(self, alias)

    monkeypatch.setattr(pump.receiver, "receive_batch", receive_batch)
    monkeypatch.setattr(writer.RecordBatch, "write", write)
    failed_steps = 0
    for _ in range(4):
        try:
            pump.receive_and_process(4)
        except DatabaseError:
            failed_steps += 1
    assert failed_steps == 1  # the failure was injected
    assert attempts.count(1) == 1 and attempts[-1] == 2
    assert transport.browse(queue, limit=10) == []
