"""Waking movers when a store makes an earlier message due.

In-process: :data:`wake_hub` (every store of this process calls it at commit).  Across
processes on PostgreSQL: ``NOTIFY`` on :data:`NOTIFY_CHANNEL` with the payload
``<table>|<due epoch>`` (``*|0``: "look now"), heard by :mod:`core.delayed.listener`.
"""
from __future__ import annotations

import threading
from typing import Callable

NOTIFY_CHANNEL = "sluice_delayed"


def notify_payload(table: str, due_epoch: float) -> str:
    return f"{table}|{due_epoch:.6f}"


class WakeHub:
    """Movers of this process, told when a store makes an earlier message due."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[int, tuple[str, Callable[[float], None]]] = {}

    def register(self, table: str, callback: Callable[[float], None]) -> int:
        with self._lock:
            key = id(callback)
            self._listeners[key] = (table, callback)
            return key

    def unregister(self, key: int) -> None:
        with self._lock:
            self._listeners.pop(key, None)

    def wake(self, table: str, due_epoch: float) -> None:
        with self._lock:
            targets = [cb for t, cb in self._listeners.values() if t == table]
        for callback in targets:
            callback(due_epoch)


wake_hub = WakeHub()
