"""The transactional session (messages from a view, a command, a task), the background
dispatcher, retention and delayed destinations."""
from __future__ import annotations

import datetime as dt
import threading
import time
from types import SimpleNamespace

import pytest
from django.db import connections, transaction

from core.conf import SluiceSettings
from core.demo.models import PingRecord
from core.errors import ConfigurationError, InvalidMessage
from core.outbox import (
    DuplicateMessage,
    Outbox,
    OutboxCleanup,
    OutboxDispatcher,
    OutboxSession,
    longest_retry_window,
    outbox_table,
    retention_warnings,
)
from core.queues import dialect
from core.transport import Transport


@pytest.fixture
def crash_after_commit(monkeypatch):
    """The process dies between the commit and phase 2 (no dispatch on commit)."""
    monkeypatch.setattr(Outbox, "after_commit", lambda self, ids: None)


def test_a_session_commits_messages_with_the_business_writes(outbox, queue):
    with transaction.atomic():
        with OutboxSession() as session:
            PingRecord.objects.create(message_id="order-1")
            session.send(queue, {"order": 1}, message_type="OrderPlaced")
        assert Transport().counts(queue).total == 0  # not before the commit
    assert [m.json() for m in Transport().browse(queue)] == [{"order": 1}]
    assert PingRecord.objects.count() == 1
    assert outbox.store.stats().undispatched == 0


def test_a_rolled_back_session_sends_nothing(outbox, queue):
    with pytest.raises(RuntimeError):
        with transaction.atomic(), OutboxSession() as session:
            PingRecord.objects.create(message_id="order-1")
            session.send(queue, "x")
            raise RuntimeError("the view failed after sending")
    assert Transport().counts(queue).total == 0 and not PingRecord.objects.exists()
    assert outbox.store.stats().records == 0


def test_a_session_is_its_own_transaction_when_none_is_open(outbox, queue):
    with OutboxSession() as session:
        session.send(queue, "x")
    assert Transport().counts(queue).total == 1


def test_a_retried_request_with_the_same_session_id_does_not_send_twice(outbox, queue):
    def place_order() -> bool:
        with transaction.atomic(), OutboxSession(message_id="checkout-42") as session:
            if session.already_processed:
                return False
            PingRecord.objects.create(message_id="order-42")
            session.send(queue, {"order": 42})
            return True

    assert place_order() is True
    assert place_order() is False
    assert Transport().counts(queue).total == 1 and PingRecord.objects.count() == 1
    # Code that does not look at already_processed is stopped at its first send.
    with pytest.raises(DuplicateMessage):
        with OutboxSession(message_id="checkout-42") as session:
            PingRecord.objects.create(message_id="order-42")
            session.send(queue, {"order": 42})
    assert Transport().counts(queue).total == 1 and PingRecord.objects.count() == 1


@pytest.mark.parametrize("control", ["optimistic", "pessimistic"])
def test_concurrent_sessions_with_one_id_commit_once(outbox, queue, settings, control):
    settings.SLUICE_OUTBOX_CONCURRENCY_CONTROL = control
    outcomes: dict[str, str] = {}
    first_inside = threading.Event()

    def request(name: str, hold: float) -> None:
        try:
            with OutboxSession(message_id="pay-7") as session:
                if session.already_processed:
                    outcomes[name] = "skipped"
                    return
                first_inside.set()
                PingRecord.objects.create(message_id="pay-7")
                session.send(queue, "charge")
                time.sleep(hold)
            outcomes[name] = "committed"
        except DuplicateMessage:
            outcomes[name] = "duplicate"
        finally:
            from django.db import connection

            connection.close()

    first = threading.Thread(target=request, args=("first", 0.5))
    first.start()
    first_inside.wait(5)
    second = threading.Thread(target=request, args=("second", 0))
    second.start()
    first.join(10)
    second.join(10)
    # Optimistic: both pass the check; the first to store its record wins (here the
    # second, which does not dawdle), the other fails with DuplicateMessage and its writes
    # roll back.  Pessimistic: the second's insert at the start waits for the first, then
    # it sees the record.  One writer at a time (SQLite): it starts after the first commits.
    assert sorted(outcomes.values()) in (["committed", "duplicate"], ["committed", "skipped"])
    if control == "pessimistic" or not dialect().supports_concurrent_writers:
        assert outcomes == {"first": "committed", "second": "skipped"}
    assert PingRecord.objects.count() == 1 and Transport().counts(queue).total == 1


def test_a_nested_session_dispatches_when_the_outer_transaction_commits(outbox, queue):
    with transaction.atomic():
        with OutboxSession() as session:
            session.send(queue, "x")
        assert outbox.store.stats().undispatched == 1
    assert Transport().counts(queue).total == 1
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            with OutboxSession() as session:
                session.send(queue, "y")
            raise RuntimeError("the outer transaction rolls back")
    assert Transport().counts(queue).total == 1 and outbox.store.stats().records == 1


def test_the_dispatcher_finishes_what_a_crash_left_undispatched(outbox, queue, crash_after_commit):
    with OutboxSession() as session:
        message_id = session.send(queue, "x")
    assert Transport().counts(queue).total == 0
    assert OutboxDispatcher(grace=60).step() > 0  # still in its grace period: not taken over yet
    stats = outbox.store.stats()
    assert stats.undispatched == 1 and stats.oldest_undispatched_age_s >= 0
    dispatcher = OutboxDispatcher(grace=0)
    dispatcher.step()
    assert dispatcher.dispatched == 1 and not dispatcher.pending()
    assert [m.headers["NServiceBus.MessageId"] for m in Transport().browse(queue)] == [message_id]


def test_a_session_without_messages_or_stable_id_leaves_no_record(outbox):
    with OutboxSession():
        PingRecord.objects.create(message_id="no messages")
    assert outbox.store.stats().records == 0


def test_session_misuse_is_refused(outbox, queue):
    with pytest.raises(ConfigurationError, match="context manager"):
        OutboxSession().send(queue, "x")
    with pytest.raises(ValueError, match="printable"):
        OutboxSession(message_id="")


def test_a_celery_task_json_cannot_carry_fails_at_send_time_and_rolls_back(outbox):
    from workers.outbox import send_task_via_outbox

    with pytest.raises(InvalidMessage, match="cannot be serialized"):
        with transaction.atomic(), OutboxSession() as session:
            PingRecord.objects.create(message_id="rolled back")
            send_task_via_outbox(session, "sluice.record_ping", args=[dt.datetime.now()])
    assert not PingRecord.objects.exists() and outbox.store.stats().records == 0
    with pytest.raises(InvalidMessage, match="countdown"):
        with OutboxSession() as session:
            send_task_via_outbox(session, "sluice.record_ping", eta=1)


def test_tasks_through_the_outbox_need_a_session_or_an_outbox_mode_handler(outbox, queue):
    from core.handlers import HandlerContext
    from core.messages import Message
    from workers.outbox import send_task_via_outbox

    context = HandlerContext(message=Message(id="m", headers={}, body=b"", queue=queue), transport=Transport())
    with pytest.raises(ConfigurationError, match="SLUICE_TRANSACTION_MODE=outbox"):
        send_task_via_outbox(context, "sluice.record_ping")


# -- retention ---------------------------------------------------------------------------


def dispatched_records(count: int) -> None:
    for i in range(count):
        with OutboxSession(message_id=f"done-{i}"):
            pass  # a stable id and no messages: a dispatched record (de-duplication data only)


def test_cleanup_deletes_old_dispatched_records_in_batches_and_never_undispatched_ones(outbox, queue,
                                                                                       crash_after_commit):
    dispatched_records(25)
    with OutboxSession(message_id="stuck") as session:
        session.send(queue, "x")
    assert outbox.cleanup() == 0  # younger than the 7-day default
    assert outbox.cleanup(keep_seconds=0, batch_size=10, max_batches=2) == 20
    assert outbox.cleanup(keep_seconds=0, batch_size=10) == 5
    assert outbox.store.stats().records == 1 and outbox.store.record("stuck") is not None


def test_cleanup_loop_runs_every_interval_and_can_be_disabled(outbox, settings):
    dispatched_records(3)
    assert OutboxCleanup(interval=0, keep_seconds=0).step() == 3600.0  # disabled: does nothing
    assert outbox.store.stats().records == 3
    settings.SLUICE_OUTBOX_CLEANUP_INTERVAL = 30
    loop = OutboxCleanup(keep_seconds=0)
    assert loop.step() == 30 and loop.deleted == 3


def test_retention_shorter_than_the_retry_window_is_warned_about(settings):
    delayed = SimpleNamespace(IMMEDIATE_RETRIES=5, PEEK_DELAY=1.0, DELAYED_RETRIES=3, DELAYED_RETRY_INCREASE=10.0,
                              OUTBOX_KEEP_DEDUPLICATION_DATA_FOR=60.0)
    # 10 + 20 + 30 s of delayed retries, and a peek delay for each of 6 × 4 attempts.
    assert longest_retry_window(delayed) == 60 + 24
    assert "shorter than the longest retry window (84 s" in retention_warnings(delayed)[0]
    assert retention_warnings(SluiceSettings()) == []  # 7 days is plenty
    from django.core import checks

    settings.SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR = 1
    assert [m.id for m in checks.run_checks() if m.id.startswith("sluice.")] == ["sluice.W001"]


def test_outbox_settings_are_validated(settings):
    with pytest.raises(ValueError, match="CONCURRENCY_CONTROL"):
        SluiceSettings(OUTBOX_CONCURRENCY_CONTROL="hopeful")
    with pytest.raises(ValueError, match="1–4000"):
        SluiceSettings(OUTBOX_CLEANUP_BATCH_SIZE=5000)
    assert outbox_table(SluiceSettings(ENDPOINT="Sales.Orders")) == "sluice_outbox_Sales.Orders"
    with pytest.raises(ConfigurationError, match="SLUICE_OUTBOX_TABLE"):
        outbox_table(SluiceSettings(OUTBOX_TABLE='x"; DROP TABLE y'))


# -- delayed destinations -----------------------------------------------------------------


def test_a_delay_is_stored_as_a_delay_and_a_delivery_time_as_given(outbox, queue, crash_after_commit):
    from core.outbox import decode_operations

    berlin = dt.timezone(dt.timedelta(hours=1))
    with OutboxSession() as session:
        session.send(queue, "a", delay=90)
        session.send(queue, "b", delay=dt.timedelta(minutes=1))
        session.send(queue, "c", deliver_at=dt.datetime(2030, 1, 1, 13, 0, tzinfo=berlin))
        session.send(queue, "d", delay=0)
        with pytest.raises(InvalidMessage, match="timezone-aware"):
            session.send(queue, "e", deliver_at=dt.datetime(2030, 1, 1))
    ops = decode_operations(outbox.store.records(undispatched_only=True)[0].operations)
    assert [(op["delay"], op["deliver_at"]) for op in ops] == [
        (90.0, None), (60.0, None), (None, "2030-01-01T12:00:00+00:00"), (None, None)]


def test_a_delay_counts_from_the_records_creation_not_from_a_late_dispatch(outbox, queue, crash_after_commit):
    from core.delayed import delayed_store

    store = delayed_store()
    store.setup_infrastructure()
    with OutboxSession() as session:
        message_id = session.send(queue, "later", delay=3600)
    record = outbox.store.records(undispatched_only=True)[0]
    # The dispatch comes ten minutes late (a crash, say): the record was stored back then.
    d = outbox.store.dialect
    created = record.created_at - dt.timedelta(minutes=10)
    with connections[outbox.using].cursor() as cursor:
        cursor.execute(f"UPDATE {d.table(outbox.store.table)} SET {d.quote('CreatedAt')} = %s "
                       f"WHERE {d.quote('MessageId')} = %s", [d.datetime_param(created), record.message_id])
    assert outbox.dispatch([record.message_id]).dispatched == [record.message_id]
    assert Transport().counts(queue).total == 0  # waiting in the delayed store, not in the queue
    stored, _ = store.list()
    due = [m.due for m in stored if m.id == message_id]
    store.delete(message_id)  # its queue is dropped after the test
    assert len(due) == 1 and abs((due[0] - created).total_seconds() - 3600) < 1
