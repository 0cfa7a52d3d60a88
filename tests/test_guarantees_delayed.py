"""Issue 18, defects 9 and 10: a delayed retry is never dropped, and a mover whose store is
on another database never loses a message between its two commits."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connections

from core.delayed import DelayedMessage, DelayedMover, SqlDelayedStore
from core.runtime.loops import ThreadRunner
from core.messages import Headers
from core.receive.pump import MessagePump
from core.transport import Transport
from tests.conftest import OTHER, uses_other_database, wait_for
from tests.test_delayed import empty, in_the_store, store  # noqa: F401 — the fixture


def _fail_once_each(queue: str) -> None:
    """One pump step with no immediate retries: each failing message goes to the store."""
    pump = MessagePump(queue, peek_delay=0.1, immediate_retries=0, delayed_retries=1)
    try:
        pump.receive_and_process(10)
    finally:
        pump.close()


def test_two_messages_with_one_id_each_keep_their_delayed_retry(store, transport, queue, temp_handlers,
                                                                 error_queue, settings):
    """send_many(..., message_id=X) makes two rows with one id.  Both fail: both delayed
    retries are stored (the store's key is not the message id), both come back, and both
    end in the error queue under id X."""
    settings.SLUICE_DELAYED_RETRY_INCREASE = 0.2
    runs: list[str] = []

    def always_fails(message, context):
        runs.append(message.body.decode())
        raise ValueError("broken")

    temp_handlers(queue, None, always_fails)
    transport.send_many(queue, ["a", "b"], message_id="same-id")
    _fail_once_each(queue)
    waiting = in_the_store(store)
    assert sorted(m.body.decode() for m in waiting) == ['a', 'b'], "a delayed retry was dropped"
    assert {m.headers[Headers.MESSAGE_ID] for m in waiting} == {"same-id"}
    pump = MessagePump(queue, peek_delay=0.1, immediate_retries=0, delayed_retries=1)
    mover = DelayedMover(store, elect=False, max_sleep=0.2)
    try:
        with ThreadRunner([pump, mover]):
            wait_for(lambda: transport.counts(error_queue).total == 2, timeout=20, what="both in the error queue")
    finally:
        mover.close()
    failed = transport.browse(error_queue)
    assert sorted(m.body.decode() for m in failed) == ['a', 'b']
    assert len({m.id for m in failed}) == 1
    assert {m.headers[Headers.MESSAGE_ID] for m in failed} == {"same-id"}
    assert all(m.headers[Headers.DELAYED_RETRIES] == "1" for m in failed)
    assert sorted(runs) == ['a', 'a', 'b', 'b']


def test_a_delayed_retry_is_stored_under_a_key_that_a_user_send_cannot_take(store, transport, queue,
                                                                            temp_handlers):
    """A message scheduled later under the same id does not push the retry out, nor the
    retry the scheduled message."""
    temp_handlers(queue, None, lambda m, c: 1 / 0)
    message_id = transport.send(queue, "now")
    transport.send(queue, "later", delay=3600, message_id=message_id)
    _fail_once_each(queue)
    stored = in_the_store(store)
    assert sorted(m.body.decode() for m in stored) == ['later', 'now']
    assert {m.headers[Headers.MESSAGE_ID] for m in stored} == {message_id}


# -- defect 10: a store on another database ----------------------------------------------------

def _due_now(store: SqlDelayedStore, queue: str, body: bytes = b'"x"') -> str:
    message = DelayedMessage(id=f"m-{queue}", destination=queue, body=body,
                             headers={Headers.MESSAGE_ID: f"m-{queue}"})
    store.store(message, delay=0)
    return message.id


@pytest.fixture
def other_store():
    other = SqlDelayedStore(using=OTHER)
    other.setup_infrastructure()
    empty(other)
    yield other
    empty(other)


def _failing_commit(alias: str):
    def commit():
        raise DatabaseError(f"injected: the process died before {alias} committed")
    return commit


@uses_other_database
def test_a_crash_before_the_queue_commit_keeps_the_message_in_a_store_elsewhere(other_store, queue,
                                                                               monkeypatch):
    """The store's delete must not commit before the queue insert: injected between the
    two, the failure leaves the message in the store, and the next step forwards it once."""
    message_id = _due_now(other_store, queue)
    mover = DelayedMover(other_store, elect=False, max_sleep=0.5)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(connections["default"], "commit", _failing_commit("the queue"))
            mover.step()
        assert Transport().counts(queue).total == 0
        assert [m.id for m in other_store.list()[0]] == [message_id], "the message was lost"
        mover.step()
    finally:
        mover.close()
    assert [m.headers[Headers.MESSAGE_ID] for m in Transport().browse(queue)] == [message_id]
    assert other_store.list()[0] == []


@uses_other_database
def test_a_crash_after_the_queue_commit_forwards_again_at_least_once(other_store, queue, monkeypatch):
    """Past the queue commit the store's delete may still fail: the message stays stored
    and is forwarded a second time (same id) — at least once, never lost."""
    message_id = _due_now(other_store, queue)
    mover = DelayedMover(other_store, elect=False, max_sleep=0.5)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(connections[OTHER], "commit", _failing_commit("the store"))
            mover.step()
        assert [m.headers[Headers.MESSAGE_ID] for m in Transport().browse(queue)] == [message_id]
        assert [m.id for m in other_store.list()[0]] == [message_id]
        mover.step()
    finally:
        mover.close()
    assert [m.headers[Headers.MESSAGE_ID] for m in Transport().browse(queue)] == [message_id, message_id]
    assert other_store.list()[0] == []
