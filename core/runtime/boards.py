"""What this process knows of a small control table (paused queues, limited queues), so a
pump's step asks a dictionary, not the database.

A board reads its table again only when told of a change (the wake-up key PAUSES_KEY: a
NOTIFY from another process, or a commit in this one) or, where no notification can reach
the process (``polling``), once the last read is older than the dialect's poll interval.
A change bumps the board's version; a read records the version it began after and
publishes what it read with that mark, so no thread takes an old state for a current one
and a change announced during a read is read again.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Generic, TypeVar

from django.db import connections

from core.conf import get_settings
from core.dialects import dialect_for
from core.runtime.wakeups import PAUSES_KEY, wake_hub

State = TypeVar("State")
Board = TypeVar("Board", bound="TableBoard")


class TableBoard(Generic[State]):
    """One control table of one database, as this process last read it (module doc).
    Subclasses say how to read it (:meth:`_read`) and may name other reasons it is stale."""

    def __init__(self, using: str, empty: State) -> None:
        self.using = using
        self._lock = threading.Lock()
        self._state = empty
        self._versions = itertools.count(1)
        self._version = next(self._versions)
        self._loaded = 0
        self._read_at = -1e9
        self._poll_interval = dialect_for(connections[using], get_settings().SCHEMA).wake_poll_interval
        self._handle = wake_hub.register(PAUSES_KEY, self._on_change)

    def mark_stale(self) -> None:
        self._version = next(self._versions)  # itertools.count: one step at a time, whatever the threads

    def _on_change(self, _due_epoch: float = 0.0) -> None:
        # Also called by wake_all() when the LISTEN connection drops or comes back.
        self.mark_stale()

    def _stale(self) -> bool:
        """Another reason to read again than a change or the poll (none here)."""
        return False

    def _due(self, polling: bool) -> bool:
        return self._loaded != self._version or self._stale() or (
            polling and time.monotonic() - self._read_at >= self._poll_interval)

    def current(self, polling: bool) -> State:
        """The table's state, read again first when due (module doc)."""
        if self._due(polling):
            self.refresh(polling)
        return self._state

    def refresh(self, polling: bool = False) -> None:
        with self._lock:
            if not self._due(polling):
                return  # another thread read it while this one waited for the lock
            seen = self._version
            self._state = self._read()
            self._read_at = time.monotonic()
            self._loaded = seen

    def _read(self) -> State:
        raise NotImplementedError


class Boards(Generic[Board]):
    """The process's boards of one kind, one per database alias, made on first use and kept
    for the process's life."""

    def __init__(self, make: Callable[[str], Board]) -> None:
        self._make = make
        self._boards: dict[str, Board] = {}
        self._lock = threading.Lock()

    def get(self, using: str) -> Board:
        found = self._boards.get(using)
        if found is None:
            with self._lock:
                found = self._boards.get(using)
                if found is None:
                    found = self._boards[using] = self._make(using)
        return found

    def forget(self) -> None:
        """Every board reads its table again at its next look: for a change made behind
        Sluice's back (a restored backup, a test database flushed)."""
        with self._lock:
            boards = list(self._boards.values())
        for found in boards:
            found.mark_stale()
