"""Circuit breakers: how loops survive a database that fails for a while.

:class:`RepeatedFailuresOverTimeCircuitBreaker` arms on the first failure and
*triggers* after ``time_to_trigger`` seconds of failures with no success between.
Armed, each failure asks for a short pause (1 s); triggered, a long one (10 s), so a
dead database is not hammered.  Triggering logs at CRITICAL and is recorded in the
process-wide :data:`breakers` registry (the health view reads it); a success disarms.
The loop itself never dies: it keeps trying at the triggered pace and recovers alone.

:class:`FailureRateCircuitBreaker` triggers when more than N failures happen within a
second (the delayed store's recovery breaker, ``maximum_recovery_failures_per_second``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Callable

log = logging.getLogger("sluice.breakers")

class BreakerStatus(StrEnum):
    """A breaker's state (published as its text: "closed", "armed", "triggered")."""

    CLOSED = "closed"
    ARMED = "armed"
    TRIGGERED = "triggered"


CLOSED, ARMED, TRIGGERED = BreakerStatus.CLOSED, BreakerStatus.ARMED, BreakerStatus.TRIGGERED


@dataclass
class BreakerState:
    name: str
    state: BreakerStatus
    failures: int
    last_error: str
    triggered_at: float | None  # wall clock, for display


class Breakers:
    """Every breaker of this process, by name (what health checks publish)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: dict[str, "RepeatedFailuresOverTimeCircuitBreaker | FailureRateCircuitBreaker"] = {}

    def add(self, breaker) -> None:
        with self._lock:
            self._all[breaker.name] = breaker

    def snapshot(self) -> list[BreakerState]:
        with self._lock:
            return [b.snapshot() for b in self._all.values()]


breakers = Breakers()


class RepeatedFailuresOverTimeCircuitBreaker:
    def __init__(
        self,
        name: str,
        time_to_trigger: float = 30.0,
        *,
        armed_pause: float = 1.0,
        triggered_pause: float = 10.0,
        on_trigger: Callable[[BaseException], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.time_to_trigger = time_to_trigger
        self.armed_pause = armed_pause
        self.triggered_pause = triggered_pause
        self.on_trigger = on_trigger
        self.clock = clock
        self.state = CLOSED
        self.failures = 0
        self.last_error = ""
        self.triggered_at: float | None = None
        self._armed_since = 0.0
        self._lock = threading.Lock()
        breakers.add(self)

    def success(self) -> None:
        if self.state == CLOSED:
            return
        with self._lock:
            was = self.state
            self.state, self.failures, self.triggered_at = CLOSED, 0, None
        log.info("circuit breaker %s: %s → closed, operations succeed again", self.name, was)

    def failure(self, exc: BaseException) -> float:
        """Record a failure; returns how long the caller should pause."""
        now = self.clock()
        fire = False
        with self._lock:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            if self.state == CLOSED:
                self.state, self._armed_since = ARMED, now
                log.warning("circuit breaker %s armed: %s", self.name, self.last_error)
            if self.state == ARMED and now - self._armed_since >= self.time_to_trigger:
                self.state, self.triggered_at, fire = TRIGGERED, time.time(), True
            pause = self.triggered_pause if self.state == TRIGGERED else self.armed_pause
        if fire:
            log.critical("circuit breaker %s TRIGGERED after %.0f s of failures: %s",
                         self.name, now - self._armed_since, self.last_error)
            if self.on_trigger is not None:
                self.on_trigger(exc)
        return pause

    def snapshot(self) -> BreakerState:
        return BreakerState(self.name, self.state, self.failures, self.last_error, self.triggered_at)


class FailureRateCircuitBreaker:
    """Triggers when more than ``max_per_second`` failures fall within one second."""

    def __init__(self, name: str, max_per_second: float = 1.0, *, pause: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.max_per_second = max_per_second
        self.pause = pause
        self.clock = clock
        self.state = CLOSED
        self.failures = 0
        self.last_error = ""
        self.triggered_at: float | None = None
        self._recent: deque[float] = deque()
        self._lock = threading.Lock()
        breakers.add(self)

    def failure(self, exc: BaseException) -> float:
        """Record a failure; returns a pause (0 unless the rate is exceeded)."""
        now = self.clock()
        with self._lock:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:500]
            self._recent.append(now)
            while self._recent and now - self._recent[0] > 1.0:
                self._recent.popleft()
            over = len(self._recent) > self.max_per_second
            fire = over and self.state != TRIGGERED
            if fire:
                self.state, self.triggered_at = TRIGGERED, time.time()
        if fire:
            log.critical("circuit breaker %s TRIGGERED: more than %g failures per second (%s)",
                         self.name, self.max_per_second, self.last_error)
        return self.pause if over else 0.0

    def success(self) -> None:
        with self._lock:
            now = self.clock()
            if self.state == TRIGGERED and (not self._recent or now - self._recent[-1] > 1.0):
                self.state, self.triggered_at = CLOSED, None
                log.info("circuit breaker %s closed", self.name)

    def snapshot(self) -> BreakerState:
        return BreakerState(self.name, self.state, self.failures, self.last_error, self.triggered_at)
