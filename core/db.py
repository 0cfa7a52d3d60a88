"""Database connection helpers."""
from __future__ import annotations

import threading
from contextlib import nullcontext

from django.db import connections

from core.dialects import dialect_for

_lock = threading.Lock()


def independent_alias(alias: str) -> str:
    """A second alias for the same database, so a transaction can run beside ``alias``'s.

    Copies the live settings of ``alias`` (under tests that is the test database).
    """
    name = f"{alias}__sluice_independent"
    with _lock:
        if name not in connections.settings:
            connections.settings[name] = dict(connections[alias].settings_dict)
    return name


class FairLock:
    """A first-come, first-served lock.  ``threading.Lock`` lets the thread that just
    released it take it straight back, which starves a waiter that wants it once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


_turns: dict[str, FairLock] = {}


def writer_turn(alias: str):
    """A context to wrap a write transaction in.  Where the database has one writer at a
    time (SQLite), the threads of this process take turns in arrival order instead of
    racing through the busy handler, whose growing sleeps let a busy pump starve the
    delayed mover; elsewhere it does nothing."""
    if dialect_for(connections[alias]).supports_concurrent_writers:
        return nullcontext()
    with _lock:
        return _turns.setdefault(alias, FairLock())
