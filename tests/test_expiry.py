"""Expiry maintenance: purging expired rows, dead-lettering them, idle temporary queues."""
from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from core.delayed import SqlDelayedStore
from core.expiry import delete_idle_queues, purge_expired_messages
from core.messages import Headers
from core.models import QueueRecord
from core.transport import Transport
from tests.conftest import open_transaction


@pytest.fixture(autouse=True)
def _delayed_store(transactional_db):
    SqlDelayedStore().setup_infrastructure()  # `sluice setup` makes it; idle checks read it


def age(queue: str, seconds: float) -> None:
    """Pretend the queue's last activity was ``seconds`` ago."""
    QueueRecord.objects.filter(name=queue).update(
        last_activity=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds))


def test_purge_removes_expired_rows_from_every_queue_in_batches(transport, make_queue):
    a, b = make_queue(), make_queue()
    for i in range(30):
        transport.send(a, str(i), ttl=0 if i % 3 else None)
        transport.send(b, str(i), ttl=0)
    removed = purge_expired_messages(batch_size=7)
    assert removed[a] == 20 and removed[b] == 30
    assert transport.counts(a).total == 10 and transport.counts(b).total == 0
    assert purge_expired_messages() == {}


def test_purge_dead_letters_where_the_queue_asks(transport, make_queue):
    name = make_queue(dead_letter_on_expiry=True)
    transport.send(name, "late", ttl=0)
    transport.send(name, "fine")
    assert purge_expired_messages()[name] == 1
    [dead] = transport.browse(name + ".deadletter")
    assert dead.body == b"late" and dead.headers[Headers.EXPIRED_REASON] == "TTLExpiredException"
    assert [m.body for m in transport.browse(name)] == [b"fine"]


@pytest.mark.row_locking
def test_purge_skips_rows_a_receiver_holds_instead_of_waiting(transport, queue):
    for i in range(10):
        transport.send(queue, str(i), ttl=0)
    held = threading.Event()
    release = threading.Event()
    released_in_time: list[bool] = []

    def receiver() -> None:
        try:
            with transaction.atomic():
                Transport().receive_batch(queue, 3)  # locks (deletes) the three oldest rows
                held.set()
                # Set only once the purge has returned: a purge that waited for these
                # rows would leave this to time out.
                released_in_time.append(release.wait(10))
                raise RuntimeError("roll back: the rows come back")
        except RuntimeError:
            pass
        finally:
            connection.close()

    thread = threading.Thread(target=receiver)
    thread.start()
    assert held.wait(10)
    removed = purge_expired_messages(batch_size=4)
    release.set()
    thread.join(15)
    assert released_in_time == [True]  # the purge finished while the receiver held its rows
    assert removed[queue] == 7
    assert transport.counts(queue).total == 3  # the receiver's rows came back, untouched


def test_idle_temporary_queues_are_deleted(transport, make_queue):
    idle = make_queue(auto_delete_on_idle=300)
    busy = make_queue(auto_delete_on_idle=300)
    normal = make_queue()
    age(idle, 400)
    age(busy, 100)
    QueueRecord.objects.filter(name=normal).update(
        last_activity=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30))
    assert delete_idle_queues() == [idle]
    assert set(QueueRecord.objects.filter(name__in=[idle, busy, normal]).values_list("name", flat=True)) \
        == {busy, normal}


def test_a_scheduled_message_keeps_a_temporary_queue_alive(transport, make_queue):
    name = make_queue(auto_delete_on_idle=300)
    message_id = transport.send(name, "later", delay=3600)
    age(name, 400)
    try:
        assert delete_idle_queues() == []
    finally:
        SqlDelayedStore().delete(message_id)


def test_activity_keeps_a_temporary_queue(transport, make_queue):
    from core.queues import registry

    name = make_queue(auto_delete_on_idle=300)
    age(name, 400)
    registry._touched.clear()  # the per-process throttle: let the next send record activity
    transport.send(name, "fresh")
    assert delete_idle_queues() == []


# -- defect 1: a temporary queue is never dropped with messages in it ---------------------

def test_send_many_records_activity_on_a_temporary_queue(transport, make_queue):
    from core.queues import registry

    name = make_queue(auto_delete_on_idle=300)
    age(name, 400)
    registry.forget()  # the per-process throttle too: the next insert records activity
    transport.send_many(name, ["a", "b"])
    last = QueueRecord.objects.get(name=name).last_activity
    assert (dt.datetime.now(dt.timezone.utc) - last).total_seconds() < 60


def test_a_temporary_queue_with_messages_in_it_is_not_dropped(transport, make_queue):
    """The delayed-delivery case: the message lands long after the queue's last recorded
    activity; the idle sweep must keep the queue while it holds a message."""
    name = make_queue(auto_delete_on_idle=300)
    transport.send_many(name, ["waiting"])
    age(name, 600)
    assert delete_idle_queues() == []
    assert [m.body for m in transport.browse(name)] == [b"waiting"]
    transport.purge(name)
    assert delete_idle_queues() == [name]  # empty and idle: now it goes


@pytest.mark.row_locking
def test_a_send_in_flight_during_the_idle_sweep_keeps_the_queue(transport, make_queue):
    """A send whose transaction is open when the sweep starts: the sweep's table lock
    waits for it, then finds the row and keeps the queue."""
    name = make_queue(auto_delete_on_idle=300)
    age(name, 600)
    result: list[list[str]] = []
    sweep = threading.Thread(target=lambda: (result.append(delete_idle_queues()), connection.close()))
    with open_transaction(lambda: Transport().send(name, "in flight")):
        sweep.start()
        sweep.join(0.5)
        assert sweep.is_alive()  # waiting on the sender's lock, not dropping the table under it
    sweep.join(10)
    assert result == [[]]
    assert [m.body for m in transport.browse(name)] == [b"in flight"]


# -- defect 9: dead-lettering in batches ---------------------------------------------------

def test_dead_lettering_moves_batches_with_one_log_line_each(transport, make_queue, caplog, monkeypatch):
    import core.expiry

    name = make_queue(dead_letter_on_expiry=True)
    transport.send_many(name, [f"late {i:03d}" for i in range(250)], ttl=0)
    transport.send(name, "fine")
    # Bound each batch by bytes: 1,000 bytes of bodies (8 bytes each) ends a batch at 125 rows.
    monkeypatch.setattr(core.expiry, "DEAD_LETTER_BYTES_PER_BATCH", 1000)
    with caplog.at_level("INFO", logger="sluice.expiry"), \
            CaptureQueriesContext(connection) as queries:
        assert purge_expired_messages(batch_size=4000) == {name: 250}
    batch_lines = [r for r in caplog.records if r.name == "sluice.expiry" and "dead-lettered" in r.getMessage()]
    assert len(batch_lines) == 2  # 125 + 125 by bytes, not one line per message
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) <= 6  # one executemany per statement of ≤ 100 rows, not one per message
    dead = transport.browse(name + ".deadletter", limit=500)
    assert sorted(m.body for m in dead) == [f"late {i:03d}".encode() for i in range(250)]
    assert all(m.headers[Headers.EXPIRED_REASON] == "TTLExpiredException" and m.expires is None for m in dead)
    assert [m.body for m in transport.browse(name)] == [b"fine"]


@pytest.mark.parametrize("count", [1, 300])
def test_a_send_to_a_queue_dropped_meanwhile_fails_clearly(transport, make_queue, count):
    """Defect 1: a process whose registry cache still has a temporary queue that another
    process's sweep dropped gets UnknownQueue, not a driver error about a missing table
    (300: a batch PostgreSQL sends as a COPY)."""
    from core.errors import UnknownQueue

    name = make_queue(auto_delete_on_idle=300)
    transport.send(name, "first")  # this process has the queue's settings cached now
    transport.purge(name)
    with connection.cursor() as cursor:  # what another process's idle sweep does
        for sql, params in transport.dialect.drop_queue_table(name):
            cursor.execute(sql, params)
    with pytest.raises(UnknownQueue, match="no longer exists"):
        transport.send_many(name, ["too late"] * count)
