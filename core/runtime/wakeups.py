"""Wake-ups: cutting a loop's wait short when there is work for it.

One mechanism for the whole process, shared by the delayed mover and the pumps:

- In-process: :data:`wake_hub`, callbacks keyed by a string — a delayed store's table
  (its movers) or :func:`queue_key` of a queue (its pumps).  Stores and
  :meth:`core.transport.Transport.enqueue` call it when their transaction commits.
- Across processes on PostgreSQL: ONE ``LISTEN`` connection per process and database
  alias (:func:`acquire_listener`), on three channels: :data:`DELAYED_CHANNEL` (payload
  ``<table>|<due epoch>``, sent by the delayed store inside its transaction),
  :data:`QUEUE_CHANNEL` (payload: a queue name) and :data:`PAUSE_CHANNEL` (a queue paused or
  resumed: core/runtime/pauses.py).  Every notification goes into the hub.
- Queue notifications are sent *after* commit by one :class:`Notifier` thread per
  process and alias, on a connection of its own, coalescing: names requested while a
  NOTIFY is in flight go out together, each queue once.  A send transaction therefore
  never takes PostgreSQL's cluster-wide notify lock at commit, and a burst of sends costs
  a handful of NOTIFYs, not one per row.

A wake-up is never lost: a callback sets the loop's event after the commit it announces,
and the runner clears the event before the step that looks at the database
(core.runtime.loops.ThreadRunner).  When the LISTEN connection drops or comes back, every loop
of the process is woken once; while it is down, pumps and movers poll
(:attr:`PostgresListener.lost`).  A connection that hears nothing for
``SLUICE_WAKEUP_HEALTH_CHECK_SECONDS`` is asked a query, and dropped if no answer comes
within ``SLUICE_WAKEUP_HEALTH_CHECK_TIMEOUT``: a half-open one (a server or middlebox
gone without a reset) would otherwise keep the listener waiting forever, deaf.

Commit hooks (:func:`on_commit_wake`) are registered robust: one that fails is logged
and never keeps the application's own ``on_commit`` hooks of that transaction from running.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any, Callable

from django.db import connections, transaction

from core.conf import get_settings

log = logging.getLogger("sluice.wakeups")

DELAYED_CHANNEL = "sluice_delayed"
QUEUE_CHANNEL = "sluice_queue"
#: A queue was paused or resumed, or its limits changed (payload: its name;
#: core/runtime/pauses.py, core/runtime/limits.py).
PAUSE_CHANNEL = "sluice_pause"
#: The hub key of the process's paused-queue and queue-limit boards (core/runtime/pauses.py,
#: core/runtime/limits.py).
PAUSES_KEY = "sluice:pauses"
#: The delayed channel's "look now, whatever the table" payload.
LOOK_NOW = "*|0"


def queue_key(queue: str) -> str:
    """The hub key of a queue's pumps (delayed stores are keyed by their table name)."""
    return f"queue:{queue}"


class WakeHub:
    """Loops of this process, told when something they wait for may have happened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, tuple[str, Callable[[float], None]]] = {}

    def register(self, key: str, callback: Callable[[float], None]) -> int:
        with self._lock:
            handle = id(callback)
            self._listeners[handle] = (key, callback)
            return handle

    def unregister(self, handle: int) -> None:
        with self._lock:
            self._listeners.pop(handle, None)

    def wake(self, key: str, due_epoch: float = 0.0) -> None:
        with self._lock:
            targets = [cb for k, cb in self._listeners.values() if k == key]
        for callback in targets:
            callback(due_epoch)

    def wake_all(self) -> None:
        """Every loop: something may have been missed (the listener dropped or came back)."""
        with self._lock:
            targets = [cb for _, cb in self._listeners.values()]
        for callback in targets:
            callback(0.0)


wake_hub = WakeHub()


def on_commit_wake(wake: Callable[[], None], using: str, what: str) -> None:
    """Run ``wake`` once the transaction on ``using`` commits.  Django runs a
    transaction's hooks in order and, unless they are robust, stops at the first that
    raises: a failing wake-up would skip the application's own hooks (and raise out of
    its ``atomic()`` after the commit).  So: robust, and logged here.  A wake-up that
    fails costs latency only: the loops find the work by polling."""
    def hook() -> None:
        try:
            wake()
        except Exception:  # noqa: BLE001 — see above: never the application's problem
            log.exception("wake-up after commit failed (%s); the loops find the work by polling", what)

    transaction.on_commit(hook, using=using, robust=True)

#: Backend pids of this process's notifiers: their NOTIFYs already woke us in-process.
_own_pids: set[int] = set()


def connection_params(using: str) -> dict[str, Any]:
    """psycopg.connect() keyword arguments for a connection like Django's for ``using``:
    the backend's own connection parameters, so OPTIONS (sslmode, sslrootcert,
    application_name, service, …) apply here as to every other connection.  Only
    Django's cursor class and type adapters are left out: these connections read
    notifications or send them, never rows."""
    params = dict(connections[using].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.setdefault("connect_timeout", 5)
    return params


def dispatch(channel: str, payload: str, pid: int | None = None) -> None:
    """One notification into the hub."""
    if channel == QUEUE_CHANNEL:
        if pid not in _own_pids:
            wake_hub.wake(queue_key(payload))
        return
    if channel == PAUSE_CHANNEL:
        wake_hub.wake(PAUSES_KEY)  # the boards first: the queue's pumps then read the news
        wake_hub.wake(queue_key(payload))
        return
    table, _, epoch = payload.rpartition("|")
    if table == "*":
        wake_hub.wake_all()
        return
    try:
        wake_hub.wake(table, float(epoch))
    except ValueError:
        wake_hub.wake(table, 0.0)


class PostgresListener(threading.Thread):
    """LISTENs on a connection of its own and hands each notification to ``callback``
    (channel, payload, sender's backend pid).

    ``connected`` is set while the connection is up.  ``lost`` is set from a drop until
    the next connect: loops poll meanwhile, as a notification sent then is never heard
    (before the first connect they need not: connecting wakes everyone)."""

    def __init__(self, using: str, callback: Callable[..., None] = dispatch,
                 channels: tuple[str, ...] = (DELAYED_CHANNEL, QUEUE_CHANNEL, PAUSE_CHANNEL), *,
                 health_check: float | None = None, health_timeout: float | None = None) -> None:
        super().__init__(name="sluice-listen", daemon=True)
        settings = get_settings()
        #: Seconds of silence before a health check, and how long its answer may take.
        self.health_check = health_check or settings.WAKEUP_HEALTH_CHECK_SECONDS
        self.health_timeout = health_timeout or settings.WAKEUP_HEALTH_CHECK_TIMEOUT
        self.params = connection_params(using)
        self.callback = callback
        self.channels = channels
        self.connected = threading.Event()
        self.lost = threading.Event()
        self._stopping = threading.Event()
        #: The server process of the current connection (operators and tests look at it).
        self.backend_pid: int | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        import psycopg  # only PostgreSQL starts a listener

        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self.params, autocommit=True) as conn:
                    for channel in self.channels:
                        conn.execute(f"LISTEN {channel}")
                    self.backend_pid = conn.info.backend_pid
                    self.lost.clear()
                    wake_hub.wake_all()  # (re)connected: something may have been missed
                    # Set last, so that whoever waits for it knows that wake-up is behind.
                    self.connected.set()
                    heard = time.monotonic()
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=min(1.0, self.health_check)):
                            heard = time.monotonic()
                            self.callback(note.channel, note.payload, note.pid)
                        if time.monotonic() - heard >= self.health_check:
                            self._check(conn)
                            heard = time.monotonic()
            except Exception as exc:  # noqa: BLE001 — a lost listener must not kill the loops
                log.warning("wake-up listener lost its connection (%s); retrying", exc)
            finally:
                was_up = self.connected.is_set()
                self.connected.clear()
                if was_up and not self._stopping.is_set():
                    self.lost.set()
                    wake_hub.wake_all()  # once: every loop now polls until we are back
            self._stopping.wait(1.0)


    def _check(self, conn: Any) -> None:
        """Ask the server a cheap query and wait at most ``health_timeout`` for the answer
        (psycopg's own execute would wait forever on a half-open connection); without
        one, close the connection and raise, so the loop reconnects.  Notifications that
        arrive meanwhile are kept by psycopg for the next ``notifies()``."""
        from psycopg import generators  # only PostgreSQL starts a listener

        try:
            with conn.lock:
                conn.pgconn.send_query(b"SELECT 1")
                conn.wait(generators.execute(conn.pgconn), timeout=self.health_timeout)
        except Exception as exc:
            # Closed here, not by the ``with`` block: its rollback would wait for an
            # answer that is not coming.
            conn.close()
            raise ConnectionError(f"no answer to the health check within {self.health_timeout:g} s "
                                  f"({type(exc).__name__}: {exc})") from exc


_listeners: dict[str, tuple[PostgresListener, int]] = {}
_listeners_lock = threading.Lock()


def acquire_listener(using: str) -> PostgresListener:
    """The process's listener for ``using`` (started on first use); pair with
    :func:`release_listener`.  A stopped one is replaced."""
    with _listeners_lock:
        current = _listeners.get(using)
        if current is None or current[0].stopping or not current[0].is_alive():
            listener = PostgresListener(using)
            listener.start()
            _listeners[using] = (listener, 1)
            return listener
        _listeners[using] = (current[0], current[1] + 1)
        return current[0]


def release_listener(using: str, listener: PostgresListener) -> None:
    """The last user of a listener stops it (tests, a worker shutting down)."""
    with _listeners_lock:
        current = _listeners.get(using)
        if current is None or current[0] is not listener:
            listener.stop()  # replaced meanwhile: this one is no one's
            return
        if current[1] <= 1:
            del _listeners[using]
            listener.stop()
        else:
            _listeners[using] = (listener, current[1] - 1)


class Notifier(threading.Thread):
    """Sends ``NOTIFY QUEUE_CHANNEL, <queue>`` after commit, coalescing (module doc).

    Its connection is closed after ``idle_close`` seconds without requests, so an idle
    web process holds no extra connection."""

    def __init__(self, using: str, sql: str, idle_close: float = 5.0) -> None:
        super().__init__(name="sluice-notify", daemon=True)
        self.params = connection_params(using)
        self.sql = sql
        self.idle_close = idle_close
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._stopping = threading.Event()
        self._conn: Any = None

    def request(self, queue: str) -> None:
        with self._lock:
            self._pending.add(queue)
        self._event.set()

    def stop(self) -> None:
        self._stopping.set()
        self._event.set()

    def run(self) -> None:
        try:
            while True:
                if not self._event.wait(self.idle_close):
                    self._close()
                    continue
                self._event.clear()
                with self._lock:
                    names, self._pending = self._pending, set()
                if names:
                    self._send(sorted(names))
                if self._stopping.is_set():  # after the last requests went out
                    break
        finally:
            self._close()

    def _send(self, names: list[str]) -> None:
        import psycopg  # only PostgreSQL starts a notifier

        for attempt in (1, 2):  # a dropped connection gets one fresh try
            try:
                if self._conn is None:
                    self._conn = psycopg.connect(**self.params, autocommit=True)
                    _own_pids.add(self._conn.info.backend_pid)
                with self._conn.cursor() as cursor:
                    for name in names:
                        cursor.execute(self.sql, [QUEUE_CHANNEL, name])
                return
            except Exception as exc:  # noqa: BLE001 — receivers' polling covers a lost NOTIFY
                self._close()
                if attempt == 2:
                    log.warning("could not notify %s (%s); their pumps find the messages by polling",
                                ", ".join(names), exc)

    def _close(self) -> None:
        if self._conn is not None:
            _own_pids.discard(self._conn.info.backend_pid)
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 — closing a broken connection
                pass
            self._conn = None


_notifiers: dict[str, Notifier] = {}


def notify_queue(using: str, queue: str, sql: str) -> None:
    """Ask this process's notifier for ``using`` to announce ``queue`` (started on first use)."""
    notifier = _notifiers.get(using)
    if notifier is None or not notifier.is_alive():
        with _listeners_lock:
            notifier = _notifiers.get(using)
            if notifier is None or not notifier.is_alive():
                notifier = _notifiers[using] = Notifier(using, sql)
                notifier.start()
                _flush_at_exit()
    notifier.request(queue)


_exit_hook: list[bool] = []


def _flush_at_exit() -> None:
    """A short-lived sender (a CLI command, a script) must not exit with its NOTIFYs still
    queued in a daemon thread: at exit the notifiers send what they hold, then stop."""
    if not _exit_hook:
        _exit_hook.append(True)
        atexit.register(shutdown)


def shutdown(timeout: float = 5.0) -> None:
    """Stop every notifier and listener of this process and close their connections
    (a worker's end; a test session before its database is dropped)."""
    with _listeners_lock:
        threads: list[threading.Thread] = [*_notifiers.values(), *(entry[0] for entry in _listeners.values())]
        _notifiers.clear()
        _listeners.clear()
    for thread in threads:
        thread.stop()  # type: ignore[attr-defined]
    for thread in threads:
        thread.join(timeout)
