"""Pausing a queue: every pump stops receiving from it within a second and starts again within
a second of the resume, told by a wake-up (in this process at commit; other processes through
LISTEN/NOTIFY on PostgreSQL, a poll of the small pause table elsewhere); sends, the delayed
mover and expiry purges carry on; the state survives a restart; a pump asks the database
nothing about pauses while none changes."""
from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.runtime import pauses
from core.delayed import delayed_store
from core.errors import UnknownQueue
from core.expiry import purge_expired_messages
from core.queues import create_queue, delete_queue
from core.transport import Transport
from core.worker import WorkerHost
from tests.conftest import manage, start_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Producer(threading.Thread):
    """Sends a message every ``every`` seconds until stopped; counts them."""

    def __init__(self, queue: str, every: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.queue, self.every, self.sent = queue, every, 0
        self._halt = threading.Event()

    def run(self) -> None:
        transport = Transport()
        try:
            while not self._halt.is_set():
                transport.send(self.queue, {"n": self.sent})
                self.sent += 1
                self._halt.wait(self.every)
        finally:
            connection.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def pending(queue: str) -> int:
    return Transport().counts(queue).pending


@pytest.fixture
def served(queue, temp_handlers, settings):
    """A worker serving ``queue`` while a producer sends to it; yields the handlers' times.
    A 1 s peek delay: the wake-ups, not a short poll, must make every deadline."""
    settings.SLUICE_PEEK_DELAY = 1.0
    handled: list[float] = []
    temp_handlers(queue, None, lambda message, context: handled.append(time.monotonic()))
    host = WorkerHost([queue], mover=False, alerts=False).start()
    producer = Producer(queue)
    producer.start()
    try:
        yield handled
    finally:
        producer.stop()
        host.stop()


def test_a_running_worker_stops_within_a_second_of_a_pause_and_drains_within_a_second_of_the_resume(
        queue, served):
    handled = served
    wait_for(lambda: len(handled) >= 20, what="the worker handles the producer's messages")
    info, changed = pauses.pause(queue, by="test")
    paused_at = time.monotonic()
    assert changed and info.queue == queue and info.paused_by == "test"
    time.sleep(1.8)
    late = [t for t in handled if t > paused_at + 1.0]
    assert not late, f"{len(late)} message(s) handled more than 1 s after the pause"
    waiting = pending(queue)
    assert waiting >= 20, "sends keep landing in a paused queue"

    before = len(handled)
    assert pauses.resume(queue, by="test")
    resumed_at = time.monotonic()
    wait_for(lambda: len(handled) > before, timeout=1.0, interval=0.01,
             what="the first message handled within 1 s of the resume")
    wait_for(lambda: len(handled) >= before + waiting, timeout=max(resumed_at + 1.0 - time.monotonic(), 0.01),
             interval=0.01, what="the backlog drained within 1 s of the resume")


def test_a_pause_from_another_process_stops_a_worker_within_a_second(queue, served):
    """The command line in a child process: on PostgreSQL its NOTIFY reaches this process's
    LISTEN connection; on SQLite the pumps' board reads the pause table every half second."""
    handled = served
    wait_for(lambda: len(handled) >= 10, what="messages handled")
    manage("sluice", "queue", "pause", queue, check=True)
    done = time.monotonic()  # the pause committed before the child exited
    time.sleep(1.5)
    assert not [t for t in handled if t > done + 1.0]
    manage("sluice", "queue", "resume", queue, check=True)
    resumed = time.monotonic()
    wait_for(lambda: any(t > resumed for t in handled), timeout=1.0, interval=0.01,
             what="handling within 1 s of the other process's resume")


def test_a_restarted_worker_keeps_a_paused_queue_paused(demo):
    from core.demo.models import PingRecord

    pauses.pause("demo", by="test")
    for _ in range(3):
        Transport().send("demo", {}, message_type="Ping")
    worker = start_worker("--queue", "demo")  # a new process: it learns the pause from the table
    try:
        time.sleep(1.5)
        assert PingRecord.objects.count() == 0 and pending("demo") == 3, "".join(worker.output)
        pauses.resume("demo")
        wait_for(lambda: PingRecord.objects.count() == 3, timeout=10, what="the pings handled after the resume")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0


def test_the_delayed_mover_and_expiry_purges_keep_working_on_a_paused_queue(queue):
    transport = Transport()
    pauses.pause(queue)
    transport.send(queue, {"n": "late"}, delay=0.2)
    transport.send(queue, {"n": "gone"}, ttl=0)
    transport.send(queue, {"n": "kept"})
    host = WorkerHost([queue], alerts=False).start()  # with the mover
    try:
        wait_for(lambda: delayed_store().next() is None, timeout=10, what="the due message moved")
        time.sleep(0.3)
    finally:
        host.stop()
    counts = transport.counts(queue)
    assert counts.pending == 2 and counts.expired == 1  # moved in, nothing received
    assert purge_expired_messages().get(queue) == 1
    assert transport.counts(queue).total == 2


def test_a_pump_asks_the_database_nothing_about_pauses_while_none_changes(queue):
    board = pauses.board("default")
    board.is_paused(queue, polling=False)  # the first look reads the table
    with CaptureQueriesContext(connection) as queries:
        for _ in range(1000):
            assert not board.is_paused(queue, polling=False)
    assert len(queries) == 0
    pauses.pause(queue)  # this process is told at commit
    with CaptureQueriesContext(connection) as queries:
        assert board.is_paused(queue, polling=False)
    assert len(queries) == 1
    # On PostgreSQL a LISTEN connection left running in this process (another test's
    # worker) may also hear the pause's NOTIFY, later: that costs one more read, no more.
    with CaptureQueriesContext(connection) as queries:
        for _ in range(1000):
            assert board.is_paused(queue, polling=False)
    assert len(queries) <= 1


def test_pause_and_resume_are_idempotent_and_name_a_known_queue(queue):
    first, changed = pauses.pause(queue, by="alice")
    again, changed_again = pauses.pause(queue, by="bob")
    assert changed and not changed_again and again == first  # the first pause is kept
    assert set(pauses.paused_queues()) == {queue}
    assert pauses.resume(queue) and not pauses.resume(queue)
    assert pauses.paused_queues() == {}
    with pytest.raises(UnknownQueue):
        pauses.pause("no_such_queue")
    with pytest.raises(UnknownQueue):
        pauses.resume("no_such_queue")


def test_a_deleted_queue_is_no_longer_paused(transactional_db):
    create_queue("pause_then_delete")
    pauses.pause("pause_then_delete")
    delete_queue("pause_then_delete")
    create_queue("pause_then_delete")
    try:
        assert pauses.pause_of("pause_then_delete") is None
    finally:
        delete_queue("pause_then_delete")


def test_until_empty_ends_while_a_paused_queue_still_holds_messages(queue):
    pauses.pause(queue)
    Transport().send(queue, {"n": 1})
    host = WorkerHost([queue], mover=False, alerts=False)
    try:
        assert host.is_empty()
        assert pending(queue) == 1
    finally:
        for pump in host.pumps:
            pump.close()


def test_a_paused_pump_thread_waits_as_on_an_empty_queue_but_polls_where_no_notification_comes(
        queue, temp_handlers, pump_for):
    """One step of a pump on a paused queue: nothing received; the wait is the peek delay
    where the resume's NOTIFY will cut it short (PostgreSQL), else no longer than the
    dialect's poll; after the resume the next step receives."""
    from core.dialects import dialect_for

    handled: list[bytes] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.body))
    Transport().send(queue, b"held")
    pump = pump_for(queue, concurrency=1, peek_delay=5)
    pauses.pause(queue)
    d = dialect_for(connection)
    # On PostgreSQL the send's and the pause's NOTIFYs also come back through the LISTEN
    # connection's thread, at any moment: a wake-up that lands during a step makes it step
    # again at once (0), as on an empty queue. The wait comes after them.
    waits = [pump.step()]
    while waits[-1] == 0 and len(waits) < 10:
        waits.append(pump.step())
    assert waits[-1] == (5 if d.supports_notify else d.wake_poll_interval), waits
    assert handled == [] and pending(queue) == 1
    pauses.resume(queue)
    pump.step()
    assert handled == [b"held"]
