"""A queue's receive keeps its plan cheap whatever its table's statistics say (PostgreSQL).

A queue that keeps up is empty most of the time, so autovacuum (Sluice asks it to come
after 1,000 dead rows) often analyzes it empty.  A receive prepared on that connection
then keeps the plan made for an empty table, a generic plan PostgreSQL does not
reconsider until the next ANALYZE, while a burst fills the queue.  With a join between
the table and the batch's row versions, that plan walked the whole table and ran the
batch's locking subquery again for every row: one receive took 17 s in ``benchmarks
horizon`` with autovacuum on, and the worker handled nothing for minutes (docs/deployment.md)."""
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
