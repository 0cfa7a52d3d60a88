"""Transport.send_many: one statement per chunk, in order, Expires from the database clock."""
from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from core.errors import InvalidMessage
from core.queues import dialect
from tests.test_delayed import store  # noqa: F401 — the fixture


def db_now(d) -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        return d.to_datetime(cursor.fetchone()[0])


def all_messages(transport, queue):
    out, after = [], 0
    while True:
        page = transport.browse(queue, limit=5000, after=after)
        if not page:
            return out
        out += page
        after = page[-1].row_version


def test_send_many_of_20000_keeps_list_order_distinct_ids_and_database_expiry(transport, queue):
    d = dialect("default")
    before = db_now(d)
    with transaction.atomic():
        ids = transport.send_many(queue, [{"i": i} for i in range(20_000)], ttl=600)
    after = db_now(d)
    messages = all_messages(transport, queue)
    assert [str(m.id) for m in messages] == ids  # RowVersion order = list order
    assert len(set(ids)) == 20_000
    assert [int(m.body.decode().split(":")[1].rstrip("}")) for m in messages] == list(range(20_000))
    slack = dt.timedelta(seconds=1)  # SQLite keeps milliseconds
    for m in messages:
        assert before + dt.timedelta(seconds=600) - slack <= m.expires <= after + dt.timedelta(seconds=600) + slack


def test_send_many_is_one_statement_per_chunk(transport, queue):
    d = dialect("default")
    per_row = 5 + len(d.ttl_params(60))
    size = d.insert_rows_per_statement(per_row)
    count = min(size * 2 + 1, 3000)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        transport.send_many(queue, ["x"] * count, ttl=60)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT INTO") and "sluice_queue" not in q["sql"]]
    assert len(inserts) == -(-count // size)
    assert transport.counts(queue).total == count


def test_send_many_without_ttl_and_a_single_message(transport, queue):
    [one] = transport.send_many(queue, ["only"])
    (m,) = transport.browse(queue)
    assert str(m.id) == one and m.expires is None


def test_send_many_with_a_delay_lands_in_the_delayed_store_in_one_statement(transport, queue, store):  # noqa: F811
    with CaptureQueriesContext(connection) as queries:
        ids = transport.send_many(queue, ["a", "b", "c"], delay=3600)
    assert transport.counts(queue).total == 0
    stored, now = store.list(100)
    mine = [m for m in stored if m.destination == queue]
    assert sorted(m.id for m in mine) == sorted(ids)
    assert all(dt.timedelta(seconds=3590) < m.due - now <= dt.timedelta(seconds=3600) for m in mine)
    assert len([q for q in queries.captured_queries if f"INSERT INTO" in q["sql"] and store.table in q["sql"]]) == 1
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    later = transport.send_many(queue, ["d", "e"], deliver_at=at)
    stored, _ = store.list(100)
    assert {m.id: m.due for m in stored if m.id in later} == {later[0]: pytest.approx(at, abs=dt.timedelta(
        milliseconds=1)), later[1]: pytest.approx(at, abs=dt.timedelta(milliseconds=1))}
    with pytest.raises(InvalidMessage, match="not both"):
        transport.send_many(queue, ["x"], delay=60, deliver_at=dt.datetime.now(dt.timezone.utc))
