"""Delayed delivery, hardened: transient database errors, the store's breaker, the LISTEN
connection, SQL Server's parameter limit and the store's table name (issue 11)."""
from __future__ import annotations

import time
import uuid

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from core.runtime.breakers import ARMED, TRIGGERED
from core.delayed import DelayedMessage, DelayedMover, DelayedStoreUnavailable, SqlDelayedStore, delayed_store
from core.delayed.listener import PostgresListener
from core.errors import UnknownQueue
from core.messages import Headers
from core.queues import create_queue, delete_queue
from core.transport import Transport
from tests.conftest import OTHER, open_transaction, uses_other_database, wait_for
from tests.test_delayed import empty, store  # noqa: F401  (fixture)


def _due_now(store: SqlDelayedStore, destination: str, body: bytes = b"x") -> str:
    message_id = str(uuid.uuid4())
    store.store(DelayedMessage(id=message_id, destination=destination, body=body,
                               headers={Headers.MESSAGE_ID: message_id}), delay=0.001)
    time.sleep(0.01)
    return message_id


# -- defect 5: a brief database error is not the message's fault ---------------------------

@pytest.mark.postgresql
def test_a_lock_timeout_retries_the_batch_instead_of_dead_lettering(store, queue, error_queue):
    message_id = _due_now(store, queue)
    mover = DelayedMover(store, number_of_retries=0, elect=False, max_sleep=0.5)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with open_transaction(lambda: connection.cursor().execute(f'LOCK TABLE "{queue}" IN ACCESS EXCLUSIVE MODE')):
            mover.step()
            # Not the message's fault: still stored, not counted, nothing in the error
            # queue; the dispatch breaker has it.
            [kept] = store.list()[0]
            assert (kept.id, kept.retry_count) == (message_id, 0)
            assert Transport().browse(error_queue) == []
            assert mover.dispatch_breaker.state == ARMED
        mover.step()  # the lock is gone: delivered, the breaker closed
        assert [m.id for m in Transport().browse(queue)] == [message_id]
        assert store.list()[0] == [] and mover.dispatch_breaker.state != ARMED
    finally:
        mover.close()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")


def test_a_failing_error_queue_insert_does_not_stall_the_batch(store, queue, error_queue):
    """The error-queue insert runs in a savepoint: when it fails too (here the error
    queue does not exist), that message stays in the store and the rest moves on."""
    good = _due_now(store, queue, b"good")
    bad = _due_now(store, f"gone_{uuid.uuid4().hex[:8]}", b"bad")
    mover = DelayedMover(store, number_of_retries=0, elect=False, error_queue=f"nowhere_{uuid.uuid4().hex[:8]}")
    try:
        mover.step()
    finally:
        mover.close()
    assert [m.body for m in Transport().browse(queue)] == [b"good"]
    [kept] = store.list()[0]
    assert kept.id == bad and kept.retry_count == 1
    assert good not in {m.id for m in store.list()[0]}


def test_transient_errors_are_told_apart_by_the_dialects_codes(transactional_db):
    """A real driver error of this database: a missing table is the statement's fault."""
    d = Transport().dialect
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute('SELECT * FROM "no_such_table_here"')
    except DatabaseError as exc:
        assert d.error_codes(exc.__cause__) or connection.vendor == "sqlite"
        assert d.is_transient(exc) is False
    else:
        pytest.fail("the query should have failed")


# -- defect 6: one store per process; its breaker accumulates and its pause holds ------------

def test_one_store_per_process(store):
    assert delayed_store() is delayed_store()
    assert Transport().delayed is delayed_store()


def test_the_store_breaker_triggers_after_the_configured_time(transactional_db, queue, settings):
    settings.SLUICE_DELAYED_TABLE = f"missing_{uuid.uuid4().hex[:8]}"  # never created: every store fails
    settings.SLUICE_TIME_TO_TRIGGER_STORE_BREAKER = 0.5
    transport = Transport()
    store = delayed_store()
    started = time.monotonic()
    with pytest.raises(DatabaseError):
        transport.send(queue, "later", delay=60)
    assert store.store_breaker.state == ARMED
    # The pause it asked for (1 s while armed) is honoured: no database call until it ends.
    with CaptureQueriesContext(connection) as queries, pytest.raises(DelayedStoreUnavailable):
        transport.send(queue, "later", delay=60)
    assert not [q for q in queries.captured_queries if settings.SLUICE_DELAYED_TABLE in q["sql"]]
    wait_for(lambda: time.monotonic() - started > 1.05, timeout=3)
    with pytest.raises(DatabaseError):
        transport.send(queue, "later", delay=60)
    assert store.store_breaker.state == TRIGGERED
    assert store.store_breaker.failures == 2


def test_a_delayed_retry_the_paused_store_cannot_take_is_received_again_not_set_aside(
        store, queue, error_queue, temp_handlers, pump_for):  # noqa: F811
    """The store pauses after a failure (its breaker); a delayed retry asked for meanwhile is
    the store's state, not the message's poison: the batch rolls back, the message waits in
    its queue with its attempts as they were, and its retry is stored once the pause ends.
    (Seen under connection kills: such messages went to the error queue as poison.)"""
    def fails(message, context):
        raise RuntimeError("handler down")

    temp_handlers(queue, None, fails)
    transport = Transport()
    message_id = transport.send(queue, "x")
    pump = pump_for(queue, immediate_retries=0, delayed_retries=1)
    used = delayed_store()  # the process's store, which the pump stores retries in
    used.store_breaker.failure(DatabaseError("connection lost"))
    used._paused_until = time.monotonic() + 60  # what a store's DatabaseError leaves
    with pytest.raises(DelayedStoreUnavailable):
        pump.receive_and_process(8)
    [waiting] = transport.browse(queue)
    assert waiting.headers[Headers.MESSAGE_ID] == message_id and waiting.failed_attempts == 0
    assert transport.counts(error_queue).total == 0
    used._paused_until = 0.0
    assert pump.receive_and_process(8) == 1
    assert transport.counts(queue).total == 0 and transport.counts(error_queue).total == 0
    [retry] = store.list()[0]
    assert retry.headers[Headers.MESSAGE_ID] == message_id and retry.headers[Headers.DELAYED_RETRIES] == "1"


# -- defect 7: the LISTEN connection, and polling while it is down --------------------------

@pytest.mark.postgresql
def test_the_listener_connects_with_the_databases_options(transactional_db):
    name = f"sluice-listen-{uuid.uuid4().hex[:8]}"
    options = connections["default"].settings_dict["OPTIONS"]
    options["application_name"] = name
    try:
        listener = PostgresListener("default", lambda *note: None)
    finally:
        del options["application_name"]
    listener.start()
    try:
        assert listener.connected.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
            assert cursor.fetchone()[0] == 1
    finally:
        listener.stop()
        listener.join(10)


@pytest.mark.postgresql
def test_a_mover_polls_while_its_listener_is_down(store):
    mover = DelayedMover(store, elect=False, max_sleep=60)
    try:
        assert mover._listener.connected.wait(10)
        assert mover.step() == 60  # listening: nothing due, sleep long, a NOTIFY wakes it
        mover._listener.stop()
        mover._listener.join(10)
        assert not mover._listener.connected.is_set()
        assert mover.step() <= store.dialect.wake_poll_interval
    finally:
        mover.close()


# -- defect 11: SQL Server's parameter limit; the store's table name --------------------------

def test_remove_many_keeps_each_statement_within_the_parameter_limit(store, monkeypatch):
    messages = [DelayedMessage(id=f"m{i}", destination="orders", body=b"", headers={}) for i in range(10)]
    for m in messages:
        store.store(m, delay=3600)
    monkeypatch.setattr(store.dialect, "max_parameters", 3)
    with CaptureQueriesContext(connection) as queries:
        assert store.remove_many(messages) == 10
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 4
    assert store.list()[0] == []


def test_the_default_table_has_no_dot_and_setup_renames_the_old_one(transactional_db, settings):
    settings.SLUICE_ENDPOINT = f"ep{uuid.uuid4().hex[:6]}"
    old = SqlDelayedStore(table=f"{settings.SLUICE_ENDPOINT}.delayed")
    old.setup_infrastructure()
    old.store(DelayedMessage(id="kept", destination="orders", body=b"b", headers={"A": "1"}), delay=3600)
    new = SqlDelayedStore()
    assert new.table == f"{settings.SLUICE_ENDPOINT}_delayed" and "." not in new.table
    try:
        new.setup_infrastructure()
        assert [(m.id, m.body, m.headers) for m in new.list()[0]] == [("kept", b"b", {"A": "1"})]
        with connection.cursor() as cursor:
            assert not new._exists(cursor, old.table)
        new.setup_infrastructure()  # idempotent
    finally:
        with connection.cursor() as cursor:
            for table in (old.table, new.table):
                cursor.execute(f"DROP TABLE IF EXISTS {new.dialect.table(table)}")


def test_an_unknown_destination_is_a_clear_error_at_forward_time(store, error_queue):
    """(Guard) a message for a deleted queue reaches the error queue with the reason."""
    name = f"temp_{uuid.uuid4().hex[:8]}"
    create_queue(name)
    message_id = _due_now(store, name)
    delete_queue(name)
    mover = DelayedMover(store, number_of_retries=0, elect=False)
    try:
        mover.step()
    finally:
        mover.close()
    [failed] = Transport().browse(error_queue)
    assert failed.id == message_id
    assert failed.headers[Headers.EXCEPTION_TYPE] == f"{UnknownQueue.__module__}.{UnknownQueue.__qualname__}"
    assert failed.headers[Headers.DELAYED_DESTINATION] == name


@uses_other_database
def test_a_store_on_another_database_keeps_a_message_whose_forward_fails(queue):
    """The mover's claim deletes as it reads, so it runs only where the store shares the
    mover's transaction.  A store on another database is read, forwarded, then cleared:
    a forward that fails (its queue is gone) leaves the message there, counted."""
    other = SqlDelayedStore(using=OTHER)
    other.setup_infrastructure()
    empty(other)
    bad = _due_now(other, f"gone_{uuid.uuid4().hex[:8]}")
    good = _due_now(other, queue)
    mover = DelayedMover(other, number_of_retries=5, elect=False, max_sleep=0.5)
    try:
        mover.step()
    finally:
        mover.close()
    [kept] = other.list()[0]
    assert (kept.id, kept.retry_count) == (bad, 1)
    assert [m.id for m in Transport().browse(queue)] == [good]
