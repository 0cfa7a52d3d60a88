"""The loop protocol, and the thread runner that hosts loops for `sluice worker` and tests.

A loop does a bounded amount of work per :meth:`Loop.step` and returns how many
seconds to wait before the next step.  The same loop class runs in a thread here and
inside a Celery worker in production.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from django.db import connections

from core.runtime.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings

log = logging.getLogger("sluice.loops")


class Loop(Protocol):
    """``name`` and :meth:`step`; optionally ``threads`` (how many threads run
    :meth:`step` at once, default 1: a pump runs one per unit of concurrency, each with
    its own wait) and ``bind_wake(wake)``: ``wake(lane)`` cuts that thread's wait short,
    ``wake()`` every thread's.  Inside a step, :func:`current_lane` says which thread
    this is."""

    name: str

    def step(self) -> float:
        """Do a bounded amount of work; return seconds to wait before the next step."""

    def close(self) -> None:
        """Release resources (threads, connections); called once when the loop stops."""


def drop_broken_connections() -> None:
    """Close this thread's connections that saw an error and no longer work.

    Django reconnects only when it has no connection at all, and checks health only
    around web requests: a loop that handled a database error itself (a breaker took
    it) would otherwise keep a dead connection, and fail every step after the database
    is back.  Only connections that saw errors are checked, so a healthy loop pays
    nothing."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block or not conn.errors_occurred:
            continue
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()


def discard_connection(alias: str) -> None:
    """Close this thread's connection to ``alias`` after a database error, unless a
    transaction is still open on it (its owner rolls back first): the next step then
    starts on a fresh connection instead of a broken one."""
    conn = connections[alias]
    if not conn.in_atomic_block:
        conn.close()


_lane = threading.local()


def current_lane() -> int:
    """Which of its loop's threads runs this step (0 outside a runner)."""
    return getattr(_lane, "index", 0)


def lanes_of(loop: Loop) -> int:
    """How many threads run ``loop`` (its ``threads`` attribute, default 1)."""
    return max(1, int(getattr(loop, "threads", 1)))


class ThreadRunner:
    """Runs each loop in its own thread (``loop.threads`` threads) until :meth:`stop`."""

    def __init__(self, loops: list[Loop]) -> None:
        self.loops = loops
        self._stop = threading.Event()
        # Set once every thread has started: no step (the health loop's heartbeat among them)
        # runs before then, so a snapshot never shows a loop not started yet as dead.
        self._all_started = threading.Event()
        # One event per thread: each thread keeps the no-lost-wake-up rule on its own
        # (cleared just before its step, so a wake after that cuts its next wait short).
        self._wake: dict[str, list[threading.Event]] = {
            loop.name: [threading.Event() for _ in range(lanes_of(loop))] for loop in loops}
        self._threads: list[threading.Thread] = []
        self._running: dict[str, int] = {}
        self._running_lock = threading.Lock()
        self._breakers: dict[str, RepeatedFailuresOverTimeCircuitBreaker] = {}
        self.errors: dict[str, int] = {loop.name: 0 for loop in loops}
        self.steps: dict[str, int] = {loop.name: 0 for loop in loops}
        self.last_step: dict[str, float] = {}

    def start(self) -> "ThreadRunner":
        try:
            for loop in self.loops:
                bind = getattr(loop, "bind_wake", None)
                if bind is not None:  # loops that can be woken early (pumps, the delayed mover)
                    bind(lambda lane=None, name=loop.name: self.wake(name, lane))
                lanes = lanes_of(loop)
                self._running[loop.name] = lanes
                # Every loop is guarded: a step that raises arms this breaker (1 s pauses), 30 s of
                # failures trigger it (10 s pauses, CRITICAL log); a good step closes it.
                self._breakers[loop.name] = RepeatedFailuresOverTimeCircuitBreaker(
                    f"loop:{loop.name}", get_settings().TIME_TO_TRIGGER_RECEIVE_BREAKER)
                for lane in range(lanes):
                    name = f"sluice-{loop.name}" + (f"-{lane}" if lane else "")
                    thread = threading.Thread(target=self._run, args=(loop, lane), name=name, daemon=True)
                    thread.start()
                    self._threads.append(thread)
        finally:
            self._all_started.set()  # (a thread that could not start raises here; the others run)
        return self

    def wake(self, name: str, lane: int | None = None) -> None:
        """Cut a loop's current wait short: one thread's (``lane``), or all of them."""
        events = self._wake.get(name)
        if events is None:
            return
        if lane is None:
            for event in events:
                event.set()
        elif 0 <= lane < len(events):
            events[lane].set()

    def _run(self, loop: Loop, lane: int = 0) -> None:
        wake = self._wake[loop.name][lane]
        _lane.index = lane
        breaker = self._breakers[loop.name]
        self._all_started.wait()
        if lane == 0:
            log.info("loop %s started (%d thread%s)", loop.name, lanes_of(loop), "" if lanes_of(loop) == 1 else "s")
        try:
            while not self._stop.is_set():
                try:
                    wait = loop.step()
                    self.steps[loop.name] += 1
                    self.last_step[loop.name] = time.time()
                    breaker.success()
                except Exception as exc:
                    self.errors[loop.name] += 1
                    wait = breaker.failure(exc)
                    if breaker.failures == 1:
                        log.exception("loop %s: step failed; retrying in %.1f s", loop.name, wait)
                    else:
                        log.warning("loop %s: step failed again (%s: %s); retrying in %.1f s",
                                    loop.name, type(exc).__name__, exc, wait)
                drop_broken_connections()
                if wait > 0:
                    wake.wait(wait)
                wake.clear()
        finally:
            with self._running_lock:
                self._running[loop.name] -= 1
                last = self._running[loop.name] == 0
            try:
                if last:  # the loop's last thread closes it, once
                    loop.close()
            finally:
                connections.close_all()
                if last:
                    log.info("loop %s stopped", loop.name)

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Ask every loop to stop after its current step; True when all have stopped."""
        self._stop.set()
        for events in self._wake.values():
            for event in events:
                event.set()
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def snapshot(self) -> list[dict]:
        """Each loop's name, whether its thread lives, its steps, errors and last step time."""
        alive = {t.name: t.is_alive() for t in self._threads}
        return [{"name": loop.name, "alive": any(alive.get(f"sluice-{loop.name}" + (f"-{lane}" if lane else ""), False)
                                                 for lane in range(lanes_of(loop))),
                 "steps": self.steps[loop.name], "errors": self.errors[loop.name],
                 "last_step": self.last_step.get(loop.name)} for loop in self.loops]

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def __enter__(self) -> "ThreadRunner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
