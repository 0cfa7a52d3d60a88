"""A queue's receive keeps its plan cheap whatever its table's statistics say (PostgreSQL).

A queue that keeps up is empty most of the time, so autovacuum (Sluice asks it to come
after 1,000 dead rows) often analyzes it empty.  A receive prepared on that connection
then keeps the plan made for an empty table, a generic plan PostgreSQL does not
reconsider until the next ANALYZE, while a burst fills the queue.  With a join between
the table and the batch's row versions, that plan walked the whole table and ran the
batch's locking subquery again for every row: one receive took 17 s in ``benchmarks
horizon`` with autovacuum on, and the worker handled nothing for minutes (docs/deployment.md).
The pump's look before a receive and the delayed store's claim met the same: each read the
whole table once it had grown."""
from __future__ import annotations

import pytest
from django.db import connection, transaction

from core.dialects import dialect_for
from core.transport import Transport

pytestmark = pytest.mark.postgresql

GROWN_TO = 50_000


def rows_read(table: str) -> int:
    """Rows this transaction has read from ``table`` so far, by sequential and index scans."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(seq_tup_read, 0) + COALESCE(idx_tup_fetch, 0) "
                       "FROM pg_stat_xact_user_tables WHERE relid = to_regclass(%s)", [table])
        return cursor.fetchone()[0]


def vacuum_analyze(table: str) -> None:
    """What autovacuum does to a drained queue table (outside any transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {table}")


@pytest.mark.parametrize("scan", ["from the mark", "from the start"])
def test_a_receive_prepared_while_the_queue_was_empty_stays_cheap_after_a_burst(transport: Transport, queue,
                                                                               marks_clock, scan):
    """Both receive statements: the usual one, from the queue's mark, and the full scan
    that comes now and then (core.runtime.marks)."""
    table = dialect_for(connection).table(queue)
    with connection.cursor() as cursor:  # the ANALYZE after the burst has not come yet (up to a minute)
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")

    def receive(limit: int) -> list:
        if scan == "from the start":
            marks_clock.now += 60  # a full scan is due
        return transport.receive_batch(queue, limit)

    transport.send_many(queue, [{"n": n} for n in range(2_000)])
    while receive(100):
        pass
    vacuum_analyze(table)
    for _ in range(12):  # past the five runs after which a prepared statement may keep a generic plan
        assert receive(8) == []
    for start in range(0, GROWN_TO, 5_000):  # the burst, with no ANALYZE after it
        transport.send_many(queue, [{"n": n} for n in range(start, start + 5_000)])
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '10s'")  # the old plan would take minutes
        before = rows_read(table)
        got = receive(8)
        read = rows_read(table) - before
        transaction.set_rollback(True)
    assert [m.json()["n"] for m in got] == list(range(8))
    assert read < 1_000, f"one receive of 8 read {read} rows of {GROWN_TO}"


def test_a_peek_prepared_while_the_queue_was_empty_stays_cheap_after_a_burst(transport: Transport, queue):
    """The pump's look before a receive after an idle wait (MAX − MIN RowVersion)."""
    table = dialect_for(connection).table(queue)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    transport.send_many(queue, [{"n": n} for n in range(2_000)])
    while transport.receive_batch(queue, 100):
        pass
    vacuum_analyze(table)
    for _ in range(12):
        assert transport.peek_estimate(queue) == 0
    for start in range(0, GROWN_TO, 5_000):
        transport.send_many(queue, [{"n": n} for n in range(start, start + 5_000)])
    with transaction.atomic():
        before = rows_read(table)
        estimate = transport.peek_estimate(queue)
        read = rows_read(table) - before
    assert estimate == GROWN_TO
    assert read < 1_000, f"one peek read {read} rows of {GROWN_TO}"


@pytest.fixture
def delayed_store(transactional_db):
    """The endpoint's delayed store, emptied, with no ANALYZE from autovacuum meanwhile."""
    from core.delayed.sql_store import SqlDelayedStore

    store = SqlDelayedStore()
    store.setup_infrastructure()
    table = store.dialect.table(store.table)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    yield store
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


def test_the_movers_claim_prepared_while_the_store_was_empty_stays_cheap_after_a_burst(delayed_store):
    import datetime as dt

    from core.delayed import DelayedMessage

    def messages(count: int, seconds: float, prefix: str) -> list:
        due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
        return [DelayedMessage(id=f"{prefix}{n}", destination="orders", body=b"x" * 100, headers={}, due=due)
                for n in range(count)]

    table = delayed_store.dialect.table(delayed_store.table)
    delayed_store.store_many(messages(2_000, -5, "early-"))
    while True:
        with transaction.atomic():
            if not delayed_store.claim(100).messages:
                break
    vacuum_analyze(table)
    for _ in range(12):
        with transaction.atomic():
            assert delayed_store.claim(10).messages == []
    for start in range(0, GROWN_TO, 5_000):  # the burst: messages due in a minute, and ten due now
        delayed_store.store_many(messages(5_000, 60, f"later-{start}-"))
    delayed_store.store_many(messages(10, -1, "due-"))
    with transaction.atomic():
        before = rows_read(table)
        claim = delayed_store.claim(10)
        read = rows_read(table) - before
        transaction.set_rollback(True)
    assert sorted(m.id for m in claim.messages) == sorted(f"due-{n}" for n in range(10))
    assert read < 1_000, f"one claim of 10 read {read} rows of {GROWN_TO}"
