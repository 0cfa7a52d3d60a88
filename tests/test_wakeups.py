"""Wake-ups: an idle pump picks up a new message at once, not at its next peek.

Each pump here waits 10 s between peeks of an empty queue, so a handling within 1 s
can only come from a wake-up (core.runtime.wakeups)."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from core.delayed import DelayedMover
from core.runtime.loops import ThreadRunner
from core.runtime import wakeups
from core.runtime.wakeups import acquire_listener, release_listener
from tests.conftest import manage, wait_for
from tests.test_delayed import store  # noqa: F401 — the fixture

IDLE = 10.0


@pytest.fixture
def handled(queue, temp_handlers):
    """Bodies the queue's handler saw, each with the time it saw it."""
    seen: list[tuple[str, float]] = []
    lock = threading.Lock()

    def record(message, context) -> None:
        with lock:
            seen.append((message.body.decode(), time.monotonic()))

    temp_handlers(queue, None, record)
    return seen


def idle_pump(pump_for, queue):
    pump = pump_for(queue, peek_delay=IDLE)
    if pump._listener is not None:
        assert pump._listener.connected.wait(10)
    # Empty: it would sleep the whole peek delay.  (A step during which the listener's
    # connect woke every loop looks once more instead: that wake-up found no idle thread.)
    assert IDLE in (pump.step(), pump.step())
    return pump


def test_a_send_in_this_process_wakes_the_idle_pump(transport, queue, pump_for, handled):
    pump = idle_pump(pump_for, queue)
    with ThreadRunner([pump]):
        time.sleep(0.2)  # asleep in its 10 s wait
        sent = time.monotonic()
        transport.send(queue, "now")
        wait_for(lambda: handled, timeout=1, what="the woken pump")
    assert handled[0][1] - sent < 1


def test_a_rolled_back_send_wakes_no_one_and_a_committed_one_wakes_at_commit(transport, queue, pump_for,
                                                                            handled):
    pump = idle_pump(pump_for, queue)
    if pump._listener is not None:  # connecting wakes every loop once: let that pass first
        assert pump._listener.connected.wait(10)
        time.sleep(0.2)
    woken = []
    pump.bind_wake(lambda lane=None: woken.append(lane))
    assert pump.step() == IDLE  # idle again: the next wake-up sets its thread's event
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            transport.send(queue, "never")
            raise RuntimeError("roll back")
    assert woken == []
    with transaction.atomic():
        transport.send(queue, "later")
        assert woken == []  # not before the commit: the pump would find nothing
    assert woken == [0]  # its one thread, once


def test_the_delayed_mover_wakes_the_pumps_of_the_queues_it_forwarded_to(transport, queue, pump_for,
                                                                        handled, store):
    pump = idle_pump(pump_for, queue)
    mover = DelayedMover(store, elect=False, max_sleep=IDLE)
    with ThreadRunner([pump, mover]):
        transport.send(queue, "due soon", delay=0.3)
        wait_for(lambda: handled, timeout=3, what="the forwarded message handled")


@pytest.mark.postgresql
def test_a_send_from_another_process_wakes_the_idle_pump_even_after_the_listener_is_killed(
        transport, queue, pump_for, handled):
    pump = idle_pump(pump_for, queue)
    assert pump._listener is not None and pump._listener.connected.wait(10)
    with ThreadRunner([pump]):
        manage("sluice", "send", queue, "--body", "first", check=True)  # returns once committed and notified
        wait_for(lambda: len(handled) == 1, timeout=1, what="a wake-up from the other process")

        listener = pump._listener
        old_pid = listener.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
        wait_for(lambda: listener.lost.is_set() or listener.backend_pid != old_pid, timeout=5,
                 what="the listener noticing its loss")
        manage("sluice", "send", queue, "--body", "second", check=True)
        wait_for(lambda: len(handled) == 2, timeout=1, what="handling after the listener's loss")
        wait_for(lambda: listener.connected.is_set() and listener.backend_pid != old_pid, timeout=5,
                 what="the listener back")
        manage("sluice", "send", queue, "--body", "third", check=True)
        wait_for(lambda: len(handled) == 3, timeout=1, what="a wake-up on the new connection")
    assert [body for body, _ in handled] == ["first", "second", "third"]


@pytest.mark.postgresql
def test_one_listener_per_process_and_a_dropped_one_polls(transactional_db, queue, pump_for):
    first, second = pump_for(queue, peek_delay=IDLE), pump_for(queue, peek_delay=IDLE)
    assert first._listener is second._listener  # one LISTEN connection, whatever the number of loops
    listener = first._listener
    assert listener.connected.wait(10)
    with connection.cursor() as cursor:
        # Its last statement is the LISTEN on whichever channel comes last.
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE %s AND pid = %s",
                       ["LISTEN sluice_%", listener.backend_pid])
        assert cursor.fetchone()[0] >= 1
        cursor.execute("SELECT pg_terminate_backend(%s)", [listener.backend_pid])
    wait_for(lambda: listener.lost.is_set() or not listener.connected.is_set(), timeout=5, what="the drop")
    if listener.lost.is_set():  # (until it is back: it reconnects within about a second)
        assert first.step() <= first._poll_while_lost
    wait_for(lambda: listener.connected.is_set(), timeout=5, what="the reconnect")
    assert first.step() == IDLE


@pytest.fixture
def no_listener_in_use():
    """This process's listener for "default" set aside while the test runs: one another
    test's loop still holds would make the test's release not the last (so no stop)."""
    with wakeups._listeners_lock:
        held = wakeups._listeners.pop("default", None)
    yield
    if held is not None:
        with wakeups._listeners_lock:
            wakeups._listeners["default"] = held


@pytest.mark.postgresql
def test_a_released_listener_is_stopped_and_replaced_on_next_use(transactional_db, no_listener_in_use):
    listener = acquire_listener("default")
    release_listener("default", listener)
    # It may still be connecting (connect_timeout 5 s on a loaded machine) before it sees the stop.
    listener.join(15)
    assert not listener.is_alive()
    again = acquire_listener("default")
    try:
        assert again is not listener and again.connected.wait(10)
    finally:
        release_listener("default", again)


def test_a_wake_up_rouses_one_idle_thread_and_a_full_batch_rouses_another(transport, queue, pump_for,
                                                                         temp_handlers):
    threads: list[str] = []

    def record(message, context) -> None:
        threads.append(threading.current_thread().name)
        time.sleep(0.01)  # busy: another thread must help with the rest

    temp_handlers(queue, None, record)
    pump = pump_for(queue, peek_delay=IDLE, concurrency=2, receive_batch_size=5)
    if not pump.threads == 2:
        pytest.skip("one writer at a time: a pump has one thread")
    with ThreadRunner([pump]):
        wait_for(lambda: all(lane.idle for lane in pump._lanes), timeout=5, what="both threads idle")
        transport.send_many(queue, [str(i) for i in range(40)])  # one commit: one wake-up
        wait_for(lambda: len(threads) == 40, timeout=5, what="all 40 handled long before the peek delay")
    assert len(set(threads)) == 2  # the first full batch roused the second thread


def test_a_burst_of_single_sends_to_a_busy_pump_loses_no_wake_up(transport, queue, pump_for, handled):
    pump = pump_for(queue, peek_delay=IDLE, concurrency=3, receive_batch_size=2)
    with ThreadRunner([pump]):
        for i in range(60):
            transport.send(queue, str(i))
            time.sleep(0.002 * (i % 3))  # sends land while threads receive, wait, or are about to
        wait_for(lambda: len(handled) == 60, timeout=2, what="every send handled well before the peek delay")
    assert sorted(int(body) for body, _ in handled) == list(range(60))
