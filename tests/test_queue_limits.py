"""Limits per queue across the pool (core/runtime/limits.py, core/receive/permits.py): at most N
messages handled at once and R taken per second, counted by the handlers themselves; the
settings' limits and an operator's (which win); a held slot comes back when its
transaction ends; an unlimited queue's receive asks the database nothing about limits."""
from __future__ import annotations

import threading
import time

import pytest
from django.core import checks
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from core.conf import from_environ, get_settings
from core.dialects import dialect_for
from core.errors import UnknownQueue
from core.models import QueueSlot, QueueTicket
from core.runtime import limits
from core.transport import Transport
from core.worker import WorkerHost
from tests.conftest import listening, open_transaction, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Counting:
    """A handler that counts how many of its calls run at once and when each started."""

    def __init__(self, hold: float = 0.0) -> None:
        self.hold = hold
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.starts: list[float] = []

    def __call__(self, message, context) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.starts.append(time.time())
        try:
            time.sleep(self.hold)
        finally:
            with self.lock:
                self.running -= 1


#: Tickets are marked by the database's clock and handlers' starts read this host's: the same
#: clock, SQLite's to the millisecond; so the count is over a window a millisecond short.
CLOCK_SLACK = 0.001


def most_in_a_second(starts: list[float], window: float = 1.0 - CLOCK_SLACK) -> int:
    """The most starts within any half-open ``window`` [t, t + window) (module doc: the slack)."""
    starts = sorted(starts)
    most, first = 0, 0
    for last, t in enumerate(starts):
        while starts[first] <= t - window:
            first += 1
        most = max(most, last - first + 1)
    return most


def serve(queue: str, count: int, handler: Counting, **pump: int) -> float:
    """Send ``count`` messages, serve the queue until all are handled; the seconds it took."""
    Transport().send_many(queue, [{"n": n} for n in range(count)])
    started = time.monotonic()
    host = WorkerHost([queue], mover=False, alerts=False, **pump).start()
    try:
        wait_for(lambda: len(handler.starts) >= count, timeout=60, what=f"{count} messages handled")
    finally:
        host.stop()
    return time.monotonic() - started


def test_at_most_n_messages_are_handled_at_once(queue, temp_handlers, settings):
    settings.SLUICE_RECEIVE_BATCH_SIZE = 2  # small batches: one thread must not take them all
    handler = Counting(hold=0.05)
    temp_handlers(queue, None, handler)
    limits.set_limits(queue, concurrency=2, rate=None, by="test")
    serve(queue, 40, handler)
    assert len(handler.starts) == 40
    if dialect_for(connection).supports_concurrent_writers:
        assert handler.most == 2  # 4 threads (SLUICE_CONCURRENCY), 2 slots
    else:
        assert handler.most == 1  # one writer at a time: the limit holds without slots


def test_at_most_r_messages_start_in_any_second(queue, temp_handlers):
    handler = Counting()
    temp_handlers(queue, None, handler)
    limits.set_limits(queue, concurrency=None, rate=5, by="test")
    took = serve(queue, 16, handler)
    assert len(handler.starts) == 16
    assert most_in_a_second(handler.starts) <= 5
    assert took >= 3.0  # 16 messages at 5 a second: at least three seconds after the first five


def test_both_limits_together(queue, temp_handlers):
    handler = Counting(hold=0.02)
    temp_handlers(queue, None, handler)
    limits.set_limits(queue, concurrency=1, rate=10)
    serve(queue, 15, handler)
    assert handler.most == 1 and most_in_a_second(handler.starts) <= 10


def test_a_held_slot_comes_back_when_its_transaction_ends(queue, temp_handlers):
    if not dialect_for(connection).supports_concurrent_writers:
        pytest.skip("one writer at a time: receives hold no slot (the write lock serialises them)")
    handler = Counting()
    temp_handlers(queue, None, handler)
    limits.set_limits(queue, concurrency=1, rate=None)
    limits.board("default").refresh()  # the slot rows exist
    Transport().send(queue, {"n": 1})
    d = dialect_for(connection)

    def hold_the_slot():
        with connection.cursor() as cursor:
            cursor.execute(d.take_slot(), [queue, 1, 1])
            assert cursor.fetchone() == (1,)

    host = WorkerHost([queue], mover=False, alerts=False)
    try:
        # The slot is held before the worker starts: started first, the worker could take
        # the slot (and the message) before the other transaction asks for it.
        with open_transaction(hold_the_slot):  # another worker's receive, as it were
            host.start()
            time.sleep(0.6)
            assert handler.starts == []  # the only slot is held: nothing is handled
        wait_for(lambda: handler.starts, timeout=5, what="the slot freed by the rollback")
    finally:
        host.stop()


def test_an_unlimited_queue_asks_the_database_nothing_about_limits(queue):
    board = limits.board("default")
    board.limits(queue, polling=False)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(1000):
            assert board.limits(queue, polling=False) is None
    assert len(queries) == 0
    limits.set_limits(queue, concurrency=3, rate=None)  # this process is told at commit
    assert board.limits(queue, polling=False).concurrency == 3


def test_the_settings_limit_a_queue_and_an_operators_limits_win(queue, settings):
    settings.SLUICE_QUEUE_LIMITS = {queue: {"concurrency": 2}}
    found = limits.limits_of(queue)
    assert (found.concurrency, found.rate, found.source) == (2, None, "settings")
    assert limits.board("default").limits(queue, polling=False).concurrency == 2
    assert QueueSlot.objects.filter(queue=queue).count() == 2  # the board made the rows
    in_force, changed = limits.set_limits(queue, concurrency=None, rate=7, by="alice")
    assert changed and (in_force.concurrency, in_force.rate, in_force.source, in_force.set_by) == \
        (None, 7, "database", "alice")
    assert QueueTicket.objects.filter(queue=queue).count() == 7
    assert limits.set_limits(queue, concurrency=None, rate=7)[1] is False  # the same again: no change
    limits.set_limits(queue, concurrency=None, rate=None)  # an operator's "no limit" lifts the setting's
    assert limits.board("default").limits(queue, polling=False) is None and queue not in limits.limits_in_force()
    assert limits.clear_limits(queue) is True and limits.clear_limits(queue) is False
    assert limits.limits_of(queue).source == "settings"  # cleared: the setting applies again


def test_a_lowered_limit_applies_at_once(queue):
    limits.set_limits(queue, concurrency=5, rate=None)
    limits.board("default").refresh()
    limits.set_limits(queue, concurrency=1, rate=None)
    d = dialect_for(connection)
    if not d.supports_concurrent_writers:
        pytest.skip("one writer at a time: no slots")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(d.take_slot(), [queue, 1, 5])
        assert [row[0] for row in cursor.fetchall()] == [1]  # rows 2..5 remain, unused


@pytest.mark.parametrize("value, message", [
    ("emails", "must be a dict"),
    ({"emails": 2}, "SLUICE_QUEUE_LIMITS['emails'] must be a dict with concurrency and/or rate"),
    ({"emails": {}}, "must be a dict with concurrency and/or rate"),
    ({"emails": {"burst": 3}}, "must be a dict with concurrency and/or rate"),
    ({"emails": {"concurrency": 0}}, "concurrency must be a whole number 1–10000"),
    ({"emails": {"rate": 2.5}}, "rate must be a whole number 1–10000 (messages per second)"),
    ({"emails": {"rate": True}}, "rate must be a whole number"),
    ({"emails": {"concurrency": 10_001}}, "concurrency must be a whole number 1–10000"),
    ({"": {"rate": 1}}, "a queue name must be a non-empty string"),
])
def test_bad_settings_are_a_check_error_naming_the_item(settings, value, message):
    settings.SLUICE_QUEUE_LIMITS = value
    with pytest.raises(ValueError, match=None) as raised:
        get_settings()
    assert message in str(raised.value)
    errors = [m for m in checks.run_checks() if m.id == "sluice.E002"]
    assert errors and message in errors[0].msg


def test_the_environment_takes_json():
    assert from_environ({"SLUICE_QUEUE_LIMITS": '{"emails": {"rate": 3}}'}) == \
        {"SLUICE_QUEUE_LIMITS": {"emails": {"rate": 3}}}
    with pytest.raises(ValueError, match="SLUICE_QUEUE_LIMITS=.* is not JSON"):
        from_environ({"SLUICE_QUEUE_LIMITS": "emails=3"})


def test_an_operators_limits_are_checked_and_name_a_known_queue(queue):
    with pytest.raises(UnknownQueue):
        limits.set_limits("no-such-queue", concurrency=1, rate=None)
    with pytest.raises(UnknownQueue):
        limits.clear_limits("no-such-queue")
    for bad in (0, -1, 10_001, 1.5, "3"):
        with pytest.raises(ValueError, match="whole number 1–10000"):
            limits.set_limits(queue, concurrency=bad, rate=None)  # type: ignore[arg-type]
    assert limits.limits_of(queue).limited is False
    assert not connections["default"].in_atomic_block


def test_an_unlimited_queues_receive_runs_no_statement_about_limits(queue, temp_handlers):
    from core.receive.pump import MessagePump

    temp_handlers(queue, None, lambda message, context: None)
    Transport().send_many(queue, [{"n": n} for n in range(5)])
    pump = MessagePump(queue, concurrency=1)
    try:
        pump.step()  # the first step reads the boards
        Transport().send_many(queue, [{"n": n} for n in range(5)])
        with CaptureQueriesContext(connection) as queries:
            pump.step()
        assert pump.stats.received == 10
        # (the board's poll where no notification comes, at most twice a second, is not the receive's)
        assert not [q["sql"] for q in queries if "sluice_queue_slot" in q["sql"] or "sluice_queue_ticket" in q["sql"]]
    finally:
        pump.close()


def test_a_receive_with_every_ticket_used_waits_until_the_oldest_is_a_second_old(queue):
    """The permit a limited receive asks for: as many messages as free tickets, then, with
    all used within the last second, none, and the wait until the oldest use is a second
    old by the database's clock."""
    from core.receive.permits import Permit

    alias = get_settings().DATABASE
    limits.set_limits(queue, concurrency=None, rate=2)
    limits.board(alias).refresh()  # the ticket rows exist
    in_force = limits.limits_of(queue)
    with transaction.atomic():
        first = Permit(in_force)
        assert first.take(alias, 5) == 2 and (first.allowed, first.wait) == (2, 0.0)
        first.spend(alias, 2)
    time.sleep(0.3)
    with transaction.atomic():
        refused = Permit(in_force)
        assert refused.take(alias, 5) == 0
    assert 0.5 < refused.wait <= 0.75, refused.wait  # a second after the use, 0.3 s of it gone
    time.sleep(refused.wait)
    with transaction.atomic():
        assert Permit(in_force).take(alias, 5) == 2  # a second after their use, both are free again


def test_a_free_ticket_another_receive_holds_is_looked_at_again_soon(queue):
    """A ticket free by its time but locked by another receive (which marks it at its
    commit): no wait of up to a second, the short look-again wait."""
    from core.receive.permits import SLOT_WAIT, Permit

    if not dialect_for(connection).supports_concurrent_writers:
        pytest.skip("one writer at a time: no other receive holds a ticket while this one asks")
    alias = get_settings().DATABASE
    limits.set_limits(queue, concurrency=None, rate=1)
    limits.board(alias).refresh()
    in_force = limits.limits_of(queue)

    def hold_the_ticket():
        assert Permit(in_force).take(alias, 1) == 1

    with open_transaction(hold_the_ticket):
        with transaction.atomic():
            refused = Permit(in_force)
            assert refused.take(alias, 1) == 0
    assert refused.wait == SLOT_WAIT


def test_a_pump_with_every_ticket_used_waits_as_its_permit_says(queue, temp_handlers, pump_for):
    """A pump thread whose permit allowed nothing waits no longer than the permit says (not
    its peek delay), then receives the next tickets' worth."""
    handled: list[int] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.json()["n"]))
    limits.set_limits(queue, concurrency=None, rate=2)
    limits.board(get_settings().DATABASE).refresh()
    Transport().send_many(queue, [{"n": n} for n in range(5)])
    pump = pump_for(queue, concurrency=1, peek_delay=5)
    listening(pump)
    assert pump.step() == 0.0 and handled == [0, 1]  # a full permit's worth: step again at once
    wait = pump.step()
    assert handled == [0, 1] and 0.5 < wait <= 1.0, wait
    time.sleep(wait)
    assert pump.step() == 0.0 and handled == [0, 1, 2, 3]


def test_a_pump_whose_slot_another_receive_holds_looks_again_soon(queue, temp_handlers, pump_for):
    """The queue's only slot held by another receive: the pump thread takes nothing and
    waits the short look-again wait (not its peek delay, not at once)."""
    from core.receive.permits import SLOT_WAIT

    if not dialect_for(connection).supports_concurrent_writers:
        pytest.skip("one writer at a time: receives hold no slot (the write lock serialises them)")
    handled: list[int] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.json()["n"]))
    limits.set_limits(queue, concurrency=1, rate=None)
    limits.board(get_settings().DATABASE).refresh()
    Transport().send(queue, {"n": 1})
    pump = pump_for(queue, concurrency=1, peek_delay=5)
    listening(pump)
    d = dialect_for(connection)

    def hold_the_slot():
        with connection.cursor() as cursor:
            cursor.execute(d.take_slot(), [queue, 1, 1])
            assert cursor.fetchone() == (1,)

    with open_transaction(hold_the_slot):
        assert pump.step() == SLOT_WAIT
        assert handled == []
    assert pump.step() == 0.0 and handled == [1]


def test_a_limited_receive_that_finds_nothing_uses_no_ticket(queue, temp_handlers, pump_for):
    """Tickets taken for a receive that then finds the queue empty are not used: they come
    back at its commit, free for the next messages within the same second."""
    handled: list[int] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.json()["n"]))
    limits.set_limits(queue, concurrency=None, rate=5)
    limits.board(get_settings().DATABASE).refresh()
    Transport().send_many(queue, [{"n": n} for n in range(2)])
    pump = pump_for(queue, concurrency=1, peek_delay=5, receive_batch_size=10)
    listening(pump)
    assert pump.step() == 0.0 and handled == [0, 1]  # all the peek saw: receive again at once
    assert pump.step() == 5  # three tickets taken, nothing found: the queue's empty wait
    Transport().send_many(queue, [{"n": n} for n in range(2, 5)])
    pump.step()
    assert handled == [0, 1, 2, 3, 4]  # the three unused tickets were free again
