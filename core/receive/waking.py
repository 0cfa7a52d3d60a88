"""How a pump's receive threads wait and are woken (core.receive.pump).

No wake-up is lost, and one wake-up rouses one thread (not a herd of empty receives):
a wake first raises the pump's ``pending`` flag, then looks for an idle thread; if it
finds one it sets that thread's event (cleared by the runner only before a step) and
lowers the flag.  A thread marks itself idle *before* it looks at the flag on its way
to a wait.  So either the wake sees the thread idle and sets its event, or the thread
sees the flag (left up because no thread was idle), lowers it and steps again at once.
A step lowers the flag as it begins: it will see the rows of every wake-up so far.

Wake-ups come from core.runtime.wakeups: a commit in this process at once, another
process's through LISTEN/NOTIFY where the database has it.  While the LISTEN connection
is lost, or where there is none, a wait is no longer than the dialect's poll interval.
"""
from __future__ import annotations

from typing import Callable

from core.queues import dialect
from core.runtime.wakeups import PostgresListener, acquire_listener, queue_key, release_listener, wake_hub


class _Lane:
    """One receive thread's state."""

    __slots__ = ("peek", "idle")

    def __init__(self) -> None:
        self.peek = True    # look before receiving (after an idle wait no wake-up cut short)
        self.idle = False   # between a short step and the next one


class PumpWaking:
    """The waiting half of a MessagePump: its threads' lanes, the pending flag, the
    registration on the wake-up hub and the LISTEN connection."""

    peek_delay: float

    def _start_waking(self, queue: str, receive_alias: str, threads: int) -> None:
        self._lanes = [_Lane() for _ in range(threads)]
        self._pending = False  # a wake-up no idle thread was roused for (module doc)
        self._wake: Callable[..., None] = lambda lane=None: None
        self._wake_alias = receive_alias
        self._hub_handle = wake_hub.register(queue_key(queue), self._on_wake)
        receive_dialect = dialect(receive_alias)
        self._poll_while_lost = receive_dialect.wake_poll_interval
        self._listener: PostgresListener | None = \
            acquire_listener(receive_alias) if receive_dialect.supports_notify else None

    def _stop_waking(self) -> None:
        wake_hub.unregister(self._hub_handle)
        if self._listener is not None:
            release_listener(self._wake_alias, self._listener)
            self._listener = None

    def bind_wake(self, wake: Callable[..., None]) -> None:
        """The runner's way to cut a thread's wait short: ``wake(lane)``."""
        self._wake = wake

    def _on_wake(self, _due_epoch: float = 0.0) -> None:
        """Rows were committed to the queue: raise the flag, then rouse an idle thread
        (order matters: module doc)."""
        self._pending = True
        if self._rouse():
            self._pending = False

    def _rouse(self) -> bool:
        """Set the event of one idle thread; False when none is idle."""
        for index, lane in enumerate(self._lanes):
            if lane.idle:
                lane.idle = False
                lane.peek = False  # there is something to take: no peek first
                self._wake(index)
                return True
        return False

    def _idle_wait(self) -> float:
        """How long an empty queue waits: the peek delay, but no longer than the dialect's
        poll while the LISTEN connection is lost (a NOTIFY sent then is never heard)."""
        if self._listener is not None and self._listener.lost.is_set():
            return min(self.peek_delay, self._poll_while_lost)
        return self.peek_delay

    def _short(self, lane: _Lane) -> float:
        """The queue looked empty: wait — unless a wake-up found no idle thread."""
        lane.idle = True  # before looking at the flag (module doc)
        if self._pending:
            self._pending = False
            lane.idle = False
            lane.peek = False
            return 0.0
        lane.peek = True
        return self._idle_wait()

    def _paused(self, lane: _Lane) -> float:
        """Paused: wait as on an empty queue (the resume's wake-up ends it: the same flag
        protocol), but where no notification can come, no longer than the board's poll."""
        wait = self._short(lane)
        return wait if self._listener is not None else min(wait, self._poll_while_lost)

    def _held_back(self, lane: _Lane, wait: float) -> float:
        """A limited queue with no slot or ticket free (core.receive.permits): wait as on an
        empty queue (a wake-up that found no idle thread still steps at once), but no
        longer than ``wait``."""
        return min(self._short(lane), wait)
