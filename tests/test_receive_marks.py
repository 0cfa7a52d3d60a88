"""A receive starts its scan at the queue's mark (core.runtime.marks): while a session holds
the MVCC horizon it walks the last batches' dead index entries, not every row delivered
since; rows that become visible below the mark are still received, FIFO where it was."""
from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction

from core.dialects import dialect_for
from core.queues import create_queue, delete_queue, registry
from core.runtime import marks
from core.runtime.marks import FULL_SCAN_EVERY, FULL_SCAN_MAX, FULL_SCAN_SHARE, TRAIL, ReceiveMarks, receive_marks
from tests.conftest import HandClock, open_transaction

KEY = ("default", "q", 1)


Clock = HandClock


# -- the marks themselves ------------------------------------------------------------------
def receive(kept: ReceiveMarks, clock: Clock, first: int | None, seconds: float = 0.001, key=KEY):
    """One receive: its look, ``seconds`` of statement, its report; the look it had."""
    look = kept.look(key)
    clock.now += seconds
    kept.received(key, look, first)
    return look


def test_without_a_full_scan_behind_it_a_receive_starts_from_the_start():
    assert ReceiveMarks().look(KEY).start is None


def test_a_full_scan_sets_the_mark_a_trail_behind_its_first_row_and_bounded_receives_move_it_on():
    clock = Clock()
    kept = ReceiveMarks(clock)
    assert receive(kept, clock, 5000).start is None
    assert receive(kept, clock, 7000).start == 5000 - TRAIL
    assert kept.look(KEY).start == 7000 - TRAIL
    receive(kept, clock, 6500)  # another thread's older batch: never back
    receive(kept, clock, None)  # nothing above the mark: it stays
    assert kept.look(KEY).start == 7000 - TRAIL


def test_a_full_scan_comes_again_after_a_second_or_twenty_times_its_own_time_at_most_ten_seconds():
    clock = Clock()
    kept = ReceiveMarks(clock)
    receive(kept, clock, 5000)
    clock.now += FULL_SCAN_EVERY - 0.02
    assert kept.look(KEY).start is not None
    clock.now += 0.02
    assert receive(kept, clock, 3000, seconds=0.25).start is None  # slow (a held horizon); rows came back below
    assert kept.look(KEY).start == 3000 - TRAIL
    clock.now += FULL_SCAN_SHARE * 0.25 - 0.26
    assert kept.look(KEY).start == 3000 - TRAIL
    clock.now += 0.01
    assert receive(kept, clock, 3000, seconds=5.0).start is None  # very slow: the wait is capped
    clock.now += FULL_SCAN_MAX - 5.0
    assert kept.look(KEY).start is None


def test_one_thread_takes_a_due_full_scan_and_the_others_go_on_from_the_mark():
    clock = Clock()
    kept = ReceiveMarks(clock)
    receive(kept, clock, 5000)
    clock.now += FULL_SCAN_EVERY
    assert kept.look(KEY).start is None  # this thread's full scan ...
    assert kept.look(KEY).start == 5000 - TRAIL  # ... and not the next thread's
    clock.now += FULL_SCAN_EVERY  # the first never reported (its statement failed): another comes
    assert kept.look(KEY).start is None


def test_a_late_report_never_undoes_a_full_scan_that_lowered_the_mark():
    clock = Clock()
    kept = ReceiveMarks(clock)
    receive(kept, clock, 5000)
    bounded = kept.look(KEY)  # a receive from the mark, slow to report
    clock.now += FULL_SCAN_EVERY
    receive(kept, clock, 2000)  # a full scan finds rows that came back below the mark
    kept.received(KEY, bounded, 9000)
    assert kept.look(KEY).start == 2000 - TRAIL
    clock.now += FULL_SCAN_EVERY
    older = kept.look(KEY)  # a full scan, so slow that the next one is due before it reports ...
    assert older.start is None
    clock.now += FULL_SCAN_EVERY
    assert receive(kept, clock, 1500).start is None
    kept.received(KEY, older, 8000)  # ... and reports after it: left out
    assert kept.look(KEY).start == 1500 - TRAIL


def test_an_empty_full_scan_keeps_the_mark_and_a_queue_never_seen_gets_none():
    clock = Clock()
    kept = ReceiveMarks(clock)
    receive(kept, clock, None)
    assert kept.look(KEY).start is None
    receive(kept, clock, 5000)
    clock.now += FULL_SCAN_EVERY
    assert receive(kept, clock, None).start is None
    assert kept.look(KEY).start == 5000 - TRAIL


def test_marks_are_kept_per_queue_table_and_bounded_in_number(monkeypatch):
    monkeypatch.setattr(marks, "MAX_MARKS", 3)
    clock = Clock()
    kept = ReceiveMarks(clock)
    for n in range(3):
        receive(kept, clock, 5000 + n, key=("default", "q", n))
    assert kept.look(("default", "q", 0)).start == 5000 - TRAIL
    assert kept.look(("default", "q", 3)).start is None  # the same name, made anew: its own key
    receive(kept, clock, 9000, key=("default", "q", 3))
    assert kept.look(("default", "q", 3)).start == 9000 - TRAIL
    assert kept.look(("default", "q", 0)).start is None  # all started again


# -- receives on a queue table --------------------------------------------------------------
def marked(transport, queue) -> bool:
    return dialect_for(connections[transport.using]).supports_receive_mark


def key_of(transport, queue):
    return (transport.using, queue, registry.get(queue, transport.using).record_id)


@pytest.fixture
def clock(marks_clock):
    return marks_clock


def test_receives_take_every_row_in_order_across_the_mark(transport, queue, clock):
    ids = transport.send_many(queue, [{"i": i} for i in range(3 * TRAIL)])
    got, firsts = [], []
    while batch := transport.receive_batch(queue, 100):
        got += [m.id for m in batch]
        firsts.append(batch[0].row_version)
    assert got == ids
    if marked(transport, queue):
        assert receive_marks.look(key_of(transport, queue)).start == firsts[-1] - TRAIL


def test_a_receive_that_rolled_back_gives_its_rows_to_the_next_one_first(transport, queue, clock):
    ids = transport.send_many(queue, [{"i": i} for i in range(50)])
    assert [m.id for m in transport.receive_batch(queue, 10)] == ids[:10]  # the full scan sets the mark
    with pytest.raises(RuntimeError), transaction.atomic():
        assert [m.id for m in transport.receive_batch(queue, 10)] == ids[10:20]
        raise RuntimeError("the handler's transaction rolls back")
    assert [m.id for m in transport.receive_batch(queue, 10)] == ids[10:20]


def row_below_the_mark(transport, queue) -> list[str]:
    """The id of a row that commits below the queue's mark: its send's transaction stays
    open while 2·TRAIL later rows commit and are received."""
    if not marked(transport, queue):
        pytest.skip("receives start at a mark where the dialect's scans pay for dead rows")
    late: list[str] = []
    with open_transaction(lambda: late.extend(transport.send_many(queue, [{"late": True}]))):
        transport.send_many(queue, [{"i": i} for i in range(2 * TRAIL)])
        while transport.receive_batch(queue, 100):
            pass
        assert receive_marks.look(key_of(transport, queue)).start is not None
    assert late
    return late


def test_a_row_that_commits_below_the_mark_is_received_at_the_next_full_scan(transport, queue, clock):
    late = row_below_the_mark(transport, queue)
    assert transport.receive_batch(queue, 10) == []  # below the mark: not seen yet
    clock.now += FULL_SCAN_EVERY
    assert [m.id for m in transport.receive_batch(queue, 10)] == late


def test_a_pumps_peek_starts_at_the_mark_and_sees_a_row_below_it_at_the_next_full_scan(transport, queue, clock):
    """The pump looks (peek_estimate(from_mark=True)) before it receives: from the mark,
    as the receive scans, and from the start on the receive's schedule; that look moves
    the mark back, so the receive after it takes the row that came back below it."""
    late = row_below_the_mark(transport, queue)
    assert transport.peek_estimate(queue) == 1  # an operator's look counts from the start
    assert transport.peek_estimate(queue, from_mark=True) == 0  # below the mark: not seen yet
    clock.now += FULL_SCAN_EVERY
    assert transport.peek_estimate(queue, from_mark=True) == 1  # the full scan is due: the look takes it
    assert receive_marks.look(key_of(transport, queue)).start <= int(transport.browse(queue)[0].row_version)
    assert [m.id for m in transport.receive_batch(queue, 10)] == late
    ids = transport.send_many(queue, [{"i": i} for i in range(3)])
    assert transport.peek_estimate(queue, from_mark=True) == 3
    assert [m.id for m in transport.receive_batch(queue, 10)] == ids


def test_a_pumps_peek_is_the_estimate_where_receives_start_at_the_start(transport, queue, clock):
    transport.send_many(queue, [{"i": i} for i in range(5)])
    assert transport.peek_estimate(queue, from_mark=True) == transport.peek_estimate(queue) == 5
    transport.receive_batch(queue, 5)
    assert transport.peek_estimate(queue, from_mark=True) == 0


def test_a_queue_made_again_under_its_old_name_is_received_from_its_start(transport, make_queue, clock):
    name = make_queue()
    transport.send_many(name, [{"i": i} for i in range(TRAIL + 200)])
    while transport.receive_batch(name, 100):
        pass
    delete_queue(name)
    create_queue(name)  # its RowVersions start again
    sent = transport.send_many(name, [{"again": True}])
    assert [m.id for m in transport.receive_batch(name, 10)] == sent


@pytest.mark.postgresql
def test_under_a_held_horizon_a_receive_and_a_pumps_peek_read_a_few_pages_not_every_delivered_row(transport, queue, clock):
    """The plan guard: with an xid held, 40,000 delivered rows stay in the RowVersion index;
    a receive (and a pump's peek) from the mark reads the last TRAIL rows' pages, one from
    the start all of them."""
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        import psycopg

        from tests.conftest import database_url

        with psycopg.connect(database_url()) as other:
            other.execute("SELECT txid_current()")
            held.set()
            release.wait(60)
            other.rollback()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        for _ in range(40):
            transport.send_many(queue, [{"i": i} for i in range(1000)])
            while transport.receive_batch(queue, 100):
                pass
        ids = transport.send_many(queue, [{"live": i} for i in range(10)])
        d = dialect_for(connection)
        start = receive_marks.look(key_of(transport, queue)).start
        assert start is not None
        from_mark = buffers_read(d.receive_from(queue), d.receive_from_params(start, 5))
        from_start = buffers_read(d.receive(queue), [5])
        assert from_mark * 10 < from_start, (from_mark, from_start)
        # The pump's look before it receives, the same way (both ends of the index).
        peek_from_mark = buffers_read(d.peek_range(queue, from_mark=True), [start, start])
        peek_from_start = buffers_read(d.peek_range(queue), [])
        assert peek_from_mark * 10 < peek_from_start, (peek_from_mark, peek_from_start)
        assert [m.id for m in transport.receive_batch(queue, 10)] == ids
    finally:
        release.set()
        holder.join(10)


def buffers_read(sql: str, params) -> int:
    """Shared buffers the statement touched (EXPLAIN ANALYZE, BUFFERS), rolled back."""
    import json

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = json.loads(plan) if isinstance(plan, str) else plan
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
