"""The model-based test's limited queue (tests/model_machine.py): a second queue, limited to
:data:`CONCURRENCY` message at once and :data:`RATE` per second across processes A and B
(core/runtime/limits.py), whose pumps the rules step alone and both at once.

Its handler counts for itself: how many of its calls run at once (a counter both
processes share, the most it reached) and, once the receive committed, the key and the
start of each call (``transaction.on_commit``: a run a killed connection rolled back is
not counted).  After every step the most at once must be within the concurrency limit,
and the committed starts within any second within the rate (tickets are marked by the
database's clock and starts read this host's: the same clock, SQLite's to the
millisecond, so the window is a millisecond short); after the drain every message sent
must have committed exactly once.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from django.db import transaction
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from core.handlers import HandlerRegistry
from core.messages import Message
from core.runtime import limits
from core.transport import Transport

CONCURRENCY, RATE = 1, 10
#: How long a call holds its slot: long enough for the other process's receive to come in.
HOLD = 0.01
#: The limited queue's drain at the end of an example: at RATE a second, at most this long.
DRAIN_SECONDS = 30.0


def most_in_a_second(starts: list[float], window: float = 0.999) -> int:
    """The most starts within any half-open ``window`` (module doc: the millisecond)."""
    starts = sorted(starts)
    most, first = 0, 0
    for last, t in enumerate(starts):
        while starts[first] <= t - window:
            first += 1
        most = max(most, last - first + 1)
    return most


class LimitedHandler:
    """The limited queue's handler and what it counted (module doc)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.lock = threading.Lock()
        self.registry = HandlerRegistry()
        self.registry.register(queue, "Limited", self.handle)
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.running = self.most = 0
            self.sent: list[str] = []
            self.committed: Counter = Counter()
            self.starts: list[float] = []

    def handle(self, message: Message, context: Any) -> None:
        key, started = message.json()["k"], time.time()
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(HOLD)
        finally:
            with self.lock:
                self.running -= 1
        transaction.on_commit(lambda: self._committed(key, started), using=context.using)

    def _committed(self, key: str, started: float) -> None:
        with self.lock:
            self.committed[key] += 1
            self.starts.append(started)

    def violations(self, final: bool = False) -> list[str]:
        with self.lock:
            found = []
            if self.most > CONCURRENCY:
                found.append(f"limited queue: {self.most} handlers ran at once, the limit is {CONCURRENCY}")
            per_second = most_in_a_second(self.starts)
            if per_second > RATE:
                found.append(f"limited queue: {per_second} committed handler starts within a second, the limit "
                             f"is {RATE}")
            found += [f"limited queue: {key} committed {n} times" for key, n in self.committed.items() if n > 1]
            if final:
                found += [f"limited queue: {key} lost" for key in self.sent if not self.committed[key]]
            return found


def set_up(queue: str) -> LimitedHandler:
    """The queue's limits (an operator's, in the database) and its handler."""
    limits.set_limits(queue, concurrency=CONCURRENCY, rate=RATE, by="model")
    return LimitedHandler(queue)


class LimitedRules:
    """The machine's rules and checks for the limited queue (mixed into SluiceMachine, which
    has ``world``, ``trace``, ``_steps`` and ``_fail_on``)."""

    world: Any

    def _limited(self) -> LimitedHandler | None:
        return self.world.limited

    @rule(count=st.integers(1, 8))
    def send_limited(self, count: int) -> None:
        handler = self._limited()
        if handler is None:
            return
        self.trace.append(f"send_limited(count={count})")  # type: ignore[attr-defined]
        keys = [f"L{len(handler.sent) + n}" for n in range(count)]
        Transport().send_many(handler.queue, [{"k": key} for key in keys], message_type="Limited")
        handler.sent.extend(keys)

    @rule(times=st.integers(1, 3), both=st.booleans())
    def limited_steps(self, times: int, both: bool) -> None:
        """The limited queue's pumps step, A's alone or A's and B's at the same time."""
        if self._limited() is None:
            return
        self.trace.append(f"limited_steps(times={times}, both={both})")  # type: ignore[attr-defined]
        procs = ("A", "B") if both else ("A",)
        self._steps([(self.world.procs[name], "limited", times) for name in procs])  # type: ignore[attr-defined]

    @invariant()
    def limits_hold(self) -> None:
        handler = self._limited()
        if handler is not None:
            self._fail_on(handler.violations(), "")  # type: ignore[attr-defined]

    def _drain_limited(self) -> None:
        """Step A's and B's limited pumps until the queue is empty (waiting as they say), then
        check that every message committed once."""
        handler = self._limited()
        if handler is None:
            return
        transport, deadline = Transport(), time.monotonic() + DRAIN_SECONDS
        while transport.counts(handler.queue).total and time.monotonic() < deadline:
            waits = self._steps([(self.world.procs[name], "limited", 1) for name in ("A", "B")])  # type: ignore[attr-defined]
            time.sleep(min(min(waits), 0.2))
        self._fail_on(handler.violations(final=True), "after the limited queue's drain")  # type: ignore[attr-defined]
