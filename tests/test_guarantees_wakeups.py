"""Issue 18, defect 7: wake-up hooks never cost the application its own ``on_commit``
hooks, and the LISTEN connection that carries wake-ups across processes comes back after
its backend is killed or its connection goes half-open."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from core.delayed import DelayedMessage
from core.runtime.wakeups import QUEUE_CHANNEL, PostgresListener, wake_hub
from tests.conftest import wait_for
from tests.tcp_proxy import TcpProxy
from tests.test_delayed import store  # noqa: F401 — the fixture


@pytest.fixture
def wake_ups_fail(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the wake-up hub is broken")

    monkeypatch.setattr(wake_hub, "wake", broken)


def test_a_failing_send_wake_up_skips_none_of_the_applications_on_commit_hooks(transport, queue, wake_ups_fail,
                                                                              caplog):
    ran: list[str] = []
    with transaction.atomic():
        transaction.on_commit(lambda: ran.append("before"))
        transport.send(queue, "x")
        transaction.on_commit(lambda: ran.append("after"))
    assert ran == ["before", "after"]
    assert transport.counts(queue).total == 1
    assert "wake-up after commit failed (queue " in caplog.text


def test_a_failing_delayed_store_wake_up_skips_none_of_the_applications_on_commit_hooks(store, wake_ups_fail,
                                                                                       caplog):
    ran: list[str] = []
    try:
        with transaction.atomic():
            store.store(DelayedMessage(id="hooked", destination="q", body=b"x", headers={}), delay=60)
            transaction.on_commit(lambda: ran.append("app"))
        assert ran == ["app"]
        assert "wake-up after commit failed (movers of " in caplog.text
    finally:
        store.delete("hooked")


# -- the LISTEN connection (PostgreSQL only) ---------------------------------------------------

class Heard:
    """What a listener handed on, waited for by payload."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, channel: str, payload: str, pid: int | None = None) -> None:
        with self._lock:
            self.payloads.append(payload)


def _notify(payload: str) -> None:
    with connection.cursor() as cursor:  # autocommit: sent at once
        cursor.execute("SELECT pg_notify(%s, %s)", [QUEUE_CHANNEL, payload])


def _listener(heard: Heard, **options) -> PostgresListener:
    return PostgresListener("default", heard, (QUEUE_CHANNEL,), health_check=0.5, health_timeout=0.5, **options)


def _heard_after_reconnect(listener: PostgresListener, heard: Heard, old_pid: int) -> None:
    wait_for(lambda: listener.connected.is_set() and listener.backend_pid not in (None, old_pid),
             timeout=15, what="the listener's reconnect")
    _notify("after")
    wait_for(lambda: "after" in heard.payloads, timeout=5, what="a wake-up after the reconnect")


@pytest.mark.postgresql
def test_wake_ups_resume_after_the_listeners_backend_is_terminated(transactional_db):
    heard = Heard()
    listener = _listener(heard)
    listener.start()
    try:
        assert listener.connected.wait(10)
        old_pid = listener.backend_pid
        _notify("before")
        wait_for(lambda: "before" in heard.payloads, timeout=5, what="the first wake-up")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
        _heard_after_reconnect(listener, heard, old_pid)
    finally:
        listener.stop()
        listener.join(10)


@pytest.mark.postgresql
def test_wake_ups_resume_after_the_listeners_connection_goes_half_open(transactional_db):
    """Frozen: the connection stays up but carries nothing, and nothing resets it.  Without
    a health check the listener would wait on it forever, hearing nothing."""
    heard = Heard()
    with TcpProxy(connection.settings_dict["HOST"] or "127.0.0.1", int(connection.settings_dict["PORT"] or 5432)) \
            as proxy:
        listener = _listener(heard)
        listener.params.update(host="127.0.0.1", port=proxy.port)
        listener.start()
        try:
            assert listener.connected.wait(10)
            old_pid = listener.backend_pid
            proxy.freeze()
            time.sleep(0.5)  # the pipe's thread has seen the freeze
            _notify("unheard")  # sent, but the frozen connection never carries it
            _heard_after_reconnect(listener, heard, old_pid)
            assert "unheard" not in heard.payloads  # the freeze was real
        finally:
            listener.stop()
            listener.join(10)
