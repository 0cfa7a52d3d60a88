"""The PostgreSQL LISTEN connection that wakes a mover when another process stores an
earlier message (see :mod:`core.delayed.wake` for the payload)."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from django.db import connections

from core.delayed.wake import NOTIFY_CHANNEL

log = logging.getLogger("sluice.delayed")


def listen_params(using: str) -> dict[str, Any]:
    """psycopg.connect() keyword arguments for a connection like Django's for ``using``:
    the backend's own connection parameters, so OPTIONS (sslmode, sslrootcert,
    application_name, service, …) apply to the listener as to every other connection.
    Only Django's cursor class and type adapters are left out: the listener reads
    notifications, not rows."""
    params = dict(connections[using].get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.setdefault("connect_timeout", 5)
    return params


class PostgresListener(threading.Thread):
    """LISTENs on a connection of its own and hands each notification to a callback.

    ``connected`` is set while the connection is up: the mover polls when it is not,
    since a notification sent meanwhile is never heard."""

    def __init__(self, using: str, callback: Callable[[str], None]) -> None:
        super().__init__(name="sluice-delayed-listen", daemon=True)
        self.params = listen_params(using)
        self.callback = callback
        self.connected = threading.Event()
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        import psycopg  # only PostgreSQL movers start a listener

        while not self._stopping.is_set():
            try:
                with psycopg.connect(**self.params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.connected.set()
                    self.callback("*|0")  # (re)connected: something may have been missed
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self.callback(note.payload)
            except Exception as exc:  # noqa: BLE001 — a lost listener must not kill the mover
                log.warning("delayed-message listener lost its connection (%s); retrying", exc)
            finally:
                self.connected.clear()
            self._stopping.wait(2.0)
