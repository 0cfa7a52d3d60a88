"""Chunked receive: one savepoint per chunk of a receive batch, not per message.

While nothing fails a chunk is the whole batch, in one savepoint.  A failing handler
rolls its chunk back; the failure is recorded once, in the receive's transaction, the
messages before it run again and the ones after go on, so business rows stay
exactly-once; after a failure the pump's chunks are smaller for a while
(core.receive.chunks.ChunkSize)."""
from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from core.demo.models import PingRecord
from core.messages import Headers
from core.receive.chunks import ChunkSize
from core.runtime.loops import ThreadRunner
from core.models.records import ProcessingRecord
from core.transport import Transport
from tests.conftest import start_workers, wait_for


class Boom(RuntimeError):
    pass


def test_message_37_of_a_chunked_batch_of_128_fails_alone(transport, queue, pump_for, temp_handlers):
    runs: dict[int, int] = {}
    sent_to = []

    def handle(message, context):
        n = message.json()["n"]
        runs[n] = runs.get(n, 0) + 1
        PingRecord.objects.using(context.using).create(message_id=message.id)
        context.send(queue, {"echo": n}, message_type="Echo")
        sent_to.append(n)
        if n == 37:
            raise Boom("37 fails")

    temp_handlers(queue, "Ping", handle)
    ids = transport.send_many(queue, [{"n": i} for i in range(128)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=128, concurrency=1, immediate_retries=5)
    with CaptureQueriesContext(connection) as queries:
        assert pump.receive_and_process(128) == 128
    handled = set(PingRecord.objects.values_list("message_id", flat=True))
    assert handled == set(ids) - {ids[37]}  # 127 business rows, each once
    assert PingRecord.objects.count() == 127
    left = Transport().browse(queue, limit=500)
    failed = [m for m in left if m.headers.get(Headers.ENCLOSED_MESSAGE_TYPES) == "Ping"]
    assert [m.id for m in failed] == [ids[37]] and failed[0].headers[Headers.FAILED_ATTEMPTS] == "1"
    # The handlers' sends: one per successful message, none from the rolled-back run.
    echoes = sorted(m.json()["echo"] for m in left if m.headers.get(Headers.ENCLOSED_MESSAGE_TYPES) == "Echo")
    assert echoes == [n for n in range(128) if n != 37]
    # The batch ran in one savepoint: 0-37, then 37 failed and the savepoint rolled back;
    # 37's failure was recorded in the same transaction, without running it again; 0-36
    # ran again in a savepoint of their own and 38-127 in another.  So the 37 before the
    # culprit ran twice; nothing else did, and the batch was received once.
    assert {n for n, count in runs.items() if count == 2} == set(range(37))
    assert runs[37] == 1 and all(runs[n] == 1 for n in range(38, 128))
    assert (pump.stats.succeeded, pump.stats.retried) == (127, 1)
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert len([q for q in sql if q.startswith("DELETE")]) == 1  # one receive
    assert not [q for q in sql if q.startswith("ROLLBACK") and "SAVEPOINT" not in q]
    # 0-127 (failed); 37's retry (its own: a refused record sets the message aside,
    # core.receive.last_resort); 0-36; 38-127.
    assert len([q for q in sql if q.startswith("SAVEPOINT")]) == 4
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT INTO")
               and "sluice_demo_ping" not in q["sql"] and ProcessingRecord._meta.db_table not in q["sql"]]
    assert len(inserts) == 3  # the retry's move; the sends of each released savepoint, one statement each
    assert pump.chunk_size.current == 32  # smaller chunks for a while after a failure
    # The processing records count each message once: the runs rolled back left none.
    outcomes = list(ProcessingRecord.objects.filter(queue=queue).values_list("outcome", flat=True))
    assert sorted(outcomes) == ["processed"] * 127 + ["retried"]


def test_a_clean_batch_runs_in_one_savepoint(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, "Ping", lambda message, context: PingRecord.objects.using(context.using)
                  .create(message_id=message.id))
    ids = transport.send_many(queue, [{"n": i} for i in range(50)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=50, concurrency=1)
    with CaptureQueriesContext(connection) as queries:
        assert pump.receive_and_process(50) == 50
    assert set(PingRecord.objects.values_list("message_id", flat=True)) == set(ids)
    sql = [q["sql"].upper() for q in queries.captured_queries]
    assert len([q for q in sql if q.startswith("SAVEPOINT")]) == 1
    assert not [q for q in sql if q.startswith("RELEASE")]  # the commit frees it
    assert pump.chunk_size.current == 50 and pump.stats.succeeded == 50


@pytest.mark.parametrize("fails", ["once", "always"])
def test_a_database_error_in_a_handler_counts_as_its_failed_attempt(
        fails, transport, queue, pump_for, temp_handlers):
    # As a handler's other exceptions: the savepoint rolls back, the attempt is counted
    # in the receive's transaction and the others of the batch commit.
    runs: dict[int, int] = {}

    def handle(message, context):
        n = message.json()["n"]
        runs[n] = runs.get(n, 0) + 1
        if n == 5 and (fails == "always" or runs[n] == 1):
            raise DatabaseError("deadlock detected")
        PingRecord.objects.using(context.using).create(message_id=message.id)

    temp_handlers(queue, "Ping", handle)
    ids = transport.send_many(queue, [{"n": i} for i in range(8)], message_type="Ping")
    pump = pump_for(queue, receive_batch_size=8, concurrency=1, immediate_retries=5)
    assert pump.receive_and_process(8) == 8
    assert runs[5] == 1
    assert set(PingRecord.objects.values_list("message_id", flat=True)) == set(ids) - {ids[5]}
    left = Transport().browse(queue, limit=10)
    assert [m.id for m in left] == [ids[5]] and left[0].headers[Headers.FAILED_ATTEMPTS] == "1"
    assert (pump.stats.succeeded, pump.stats.retried) == (7, 1)
    assert pump.receive_and_process(8) == 1
    assert runs[5] == 2
    if fails == "once":
        assert PingRecord.objects.count() == 8 and Transport().browse(queue, limit=10) == []
    else:
        assert Transport().browse(queue, limit=10)[0].headers[Headers.FAILED_ATTEMPTS] == "2"


def test_a_message_that_expires_while_its_handler_fails_is_expired_not_run_again(
        transport, queue, pump_for, temp_handlers):
    runs = []

    def handle(message, context):
        runs.append(message.json()["n"])
        if message.json()["n"] == 1:
            time.sleep(2.3)  # past its TTL, by the database's clock
            raise Boom("too late anyway")
        PingRecord.objects.using(context.using).create(message_id=message.id)

    temp_handlers(queue, "Ping", handle)
    ids = [transport.send(queue, {"n": i}, message_type="Ping", ttl=2 if i == 1 else None) for i in range(3)]
    pump = pump_for(queue, receive_batch_size=3, concurrency=1, immediate_retries=5)
    assert pump.receive_and_process(3) == 3
    assert set(PingRecord.objects.values_list("message_id", flat=True)) == {ids[0], ids[2]}
    assert pump.receive_and_process(3) == 1  # its retry, expired by now: not run again
    assert Transport().browse(queue, limit=10) == []
    assert runs.count(1) == 1
    assert (pump.stats.succeeded, pump.stats.expired, pump.stats.retried) == (2, 1, 1)


def test_with_four_threads_a_failure_is_counted_once_per_run(
        transport, queue, error_queue, pump_for, temp_handlers):
    # A failure is recorded on the culprit's row in the transaction that received it: no
    # other thread can take the row in between and run the same attempt again.
    attempts: dict[int, list[int]] = {}
    lock = threading.Lock()

    def handle(message, context):
        n = message.json()["n"]
        with lock:
            attempts.setdefault(n, []).append(context.attempt)
        if n % 4 == 0:
            raise Boom(f"{n} always fails")
        PingRecord.objects.using(context.using).create(message_id=message.id)

    temp_handlers(queue, "Ping", handle)
    for round_ in range(5):  # single sends, so that batches are small and runs many
        for n in range(round_ * 8, round_ * 8 + 8):
            transport.send(queue, {"n": n}, message_type="Ping")
    pump = pump_for(queue, receive_batch_size=4, concurrency=4, immediate_retries=2)
    with ThreadRunner([pump]):
        wait_for(lambda: transport.counts(error_queue).total == 10, timeout=30, what="10 in the error queue")
    assert {n: runs for n, runs in attempts.items() if n % 4 == 0} == {n: [1, 2, 3] for n in range(0, 40, 4)}
    # The others succeed at their first attempt; one before a culprit in its chunk runs
    # again after the savepoint's rollback (its side effects outside the database can
    # repeat), and its business row is written once.
    assert all(set(attempts[n]) == {1} for n in range(40) if n % 4)
    assert PingRecord.objects.count() == 30


def test_chunks_shrink_after_a_failure_and_grow_back_while_nothing_fails():
    size = ChunkSize(100)
    assert size.current == 100  # nothing failed yet: the whole batch in one savepoint
    size.after(100, failures=1)
    assert size.current == 25
    size.after(25, failures=2)
    size.after(8, failures=1)
    assert size.current == 8  # never below the smallest chunk
    for expected in (16, 32, 64, 100, 100):
        size.after(size.current, failures=0)
        assert size.current == expected
    assert ChunkSize(1000).smallest == 63  # at most 16 chunks' savepoints in a batch
    assert ChunkSize(5).smallest == 5
    small = ChunkSize(8)
    small.after(8, failures=1)
    assert small.current == 8


@pytest.mark.row_locking
def test_random_failures_over_20000_messages_with_two_workers_leave_every_row_exactly_once(
        make_queue, error_queue):
    queue = make_queue()
    ids = []
    transport = Transport()
    for start in range(0, 20_000, 5_000):
        ids += transport.send_many(queue, [{"n": i} for i in range(start, start + 5_000)], message_type="Flaky")
    env = {"SLUICE_HANDLER_MODULES": "tests.chunk_handlers", "CHUNK_TEST_QUEUE": queue,
           "SLUICE_RECEIVE_BATCH_SIZE": "100", "SLUICE_IMMEDIATE_RETRIES": "20", "SLUICE_LOG_LEVEL": "ERROR"}
    workers = start_workers(2, "--queue", queue, "--concurrency", "2", env=env)
    try:
        wait_for(lambda: PingRecord.objects.count() >= 20_000 and transport.counts(queue).total == 0,
                 timeout=300, interval=0.5, what="20,000 messages handled")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    rows = list(PingRecord.objects.values_list("message_id", flat=True))
    assert len(rows) == 20_000 and set(rows) == set(ids)
    # None of ours in the error queue (the workers' delayed movers may move other tests'
    # leftovers there: delayed retries whose queues those tests dropped).
    errored = {m.headers.get(Headers.MESSAGE_ID, m.id) for m in transport.browse(error_queue, limit=10_000)}
    assert not errored & set(ids)
    retried = sum(int(line.split("retried ")[1].split(",")[0])
                  for w in workers for line in w.output if ": received " in line)
    assert retried > 500  # about 5 % of 20,000 attempts failed, and each was retried


def test_sigkill_in_the_middle_of_a_chunk_loses_nothing_and_doubles_nothing(make_queue, error_queue, tmp_path):
    queue = make_queue()
    transport = Transport()
    ids = transport.send_many(queue, [{"n": i} for i in range(40)], message_type="Flaky")
    ids.insert(20, transport.send(queue, {"n": "stall"}, message_type="Stall"))
    ids += transport.send_many(queue, [{"n": i} for i in range(40, 80)], message_type="Flaky")
    marker = tmp_path / "stalled"
    env = {"SLUICE_HANDLER_MODULES": "tests.chunk_handlers", "CHUNK_TEST_QUEUE": queue,
           "CHUNK_TEST_MARKER": str(marker), "CHUNK_TEST_FAIL_RATE": "0", "SLUICE_RECEIVE_BATCH_SIZE": "100"}
    (worker,) = start_workers(1, "--queue", queue, "--concurrency", "1", env=env)
    try:
        wait_for(marker.exists, timeout=30, what="the worker stalled inside a chunk")
        time.sleep(0.2)
        assert PingRecord.objects.count() == 0  # nothing of the open batch is committed
    finally:
        worker.kill()
        worker.wait(10)
    (again,) = start_workers(1, "--queue", queue, "--concurrency", "1", env=env)
    try:
        wait_for(lambda: PingRecord.objects.count() >= len(ids) and transport.counts(queue).total == 0,
                 timeout=60, what="everything handled after the restart")
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(30)
    rows = list(PingRecord.objects.values_list("message_id", flat=True))
    assert sorted(rows) == sorted(ids)


def test_a_failed_attempts_processing_record_times_its_handler(transport, queue, pump_for, temp_handlers):
    """The record of a failed attempt starts when its handler started, as a success's does:
    the failure carries the start out of the rolled-back chunk."""
    def slow_failure(message, context):
        time.sleep(0.1)
        raise Boom("after a while")

    temp_handlers(queue, "Slow", slow_failure)
    transport.send(queue, {"n": 1}, message_type="Slow")
    pump_for(queue, immediate_retries=1, concurrency=1).receive_and_process(10)

    [record] = ProcessingRecord.objects.filter(queue=queue)
    assert record.outcome == "retried"
    assert record.ended_us - record.started_us >= 100_000


@pytest.mark.django_db(transaction=True)
def test_a_chunks_transport_holds_sends_until_the_flush_but_not_one_whose_caller_needs_a_row_now(queue):
    """Inside a chunk a handler's sends are held for one insert at the flush; a send with a
    statement ``along`` (a task's result row, say) is written at once, as its caller needs
    that statement's row now, still inside the chunk's transaction."""
    from django.db import transaction

    from core.receive.transaction_modes import ChunkBufferedTransport

    chunk = ChunkBufferedTransport("default")
    with transaction.atomic():
        chunk.send(queue, {"n": 1}, message_type="Held")
        _, row = chunk.send_along(queue, {"n": 2}, ("SELECT 42", []), message_type="Along")
        assert tuple(row) == (42,)
        assert [m.json()["n"] for m in Transport().browse(queue)] == [2]
        chunk.flush()
        assert sorted(m.json()["n"] for m in Transport().browse(queue)) == [1, 2]
