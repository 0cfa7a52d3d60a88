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

log = logging.getLogger("sluice.loops")

#: Wait after a step raised, so a failing database is not hammered.
ERROR_BACKOFF_SECONDS = 1.0


class Loop(Protocol):
    name: str

    def step(self) -> float:
        """Do a bounded amount of work; return seconds to wait before the next step."""

    def close(self) -> None:
        """Release resources (threads, connections); called once when the loop stops."""


class ThreadRunner:
    """Runs each loop in its own thread until :meth:`stop`."""

    def __init__(self, loops: list[Loop]) -> None:
        self.loops = loops
        self._stop = threading.Event()
        self._wake: dict[str, threading.Event] = {loop.name: threading.Event() for loop in loops}
        self._threads: list[threading.Thread] = []
        self.errors: dict[str, int] = {loop.name: 0 for loop in loops}
        self.steps: dict[str, int] = {loop.name: 0 for loop in loops}
        self.last_step: dict[str, float] = {}

    def start(self) -> "ThreadRunner":
        for loop in self.loops:
            bind = getattr(loop, "bind_wake", None)
            if bind is not None:  # loops that can be woken early (the delayed mover)
                bind(lambda name=loop.name: self.wake(name))
            thread = threading.Thread(target=self._run, args=(loop,), name=f"sluice-{loop.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wake(self, name: str) -> None:
        """Cut a loop's current wait short."""
        event = self._wake.get(name)
        if event is not None:
            event.set()

    def _run(self, loop: Loop) -> None:
        wake = self._wake[loop.name]
        log.info("loop %s started", loop.name)
        try:
            while not self._stop.is_set():
                try:
                    wait = loop.step()
                    self.steps[loop.name] += 1
                    self.last_step[loop.name] = time.time()
                except Exception:
                    self.errors[loop.name] += 1
                    log.exception("loop %s: step failed; retrying in %.1f s", loop.name, ERROR_BACKOFF_SECONDS)
                    # A broken connection must not be reused by the next step.
                    for conn in connections.all(initialized_only=True):
                        if not conn.in_atomic_block:
                            conn.close()
                    wait = ERROR_BACKOFF_SECONDS
                if wait > 0:
                    wake.wait(wait)
                wake.clear()
        finally:
            try:
                loop.close()
            finally:
                connections.close_all()
                log.info("loop %s stopped", loop.name)

    def stop(self, timeout: float | None = 30.0) -> bool:
        """Ask every loop to stop after its current step; True when all have stopped."""
        self._stop.set()
        for event in self._wake.values():
            event.set()
        for thread in self._threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def snapshot(self) -> list[dict]:
        """Each loop's name, whether its thread lives, its steps, errors and last step time."""
        alive = {t.name: t.is_alive() for t in self._threads}
        return [{"name": loop.name, "alive": alive.get(f"sluice-{loop.name}", False),
                 "steps": self.steps[loop.name], "errors": self.errors[loop.name],
                 "last_step": self.last_step.get(loop.name)} for loop in self.loops]

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def __enter__(self) -> "ThreadRunner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
