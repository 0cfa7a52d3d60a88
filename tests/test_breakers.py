"""Circuit breakers, with a clock the test controls."""
from __future__ import annotations

import logging

from core.runtime.breakers import ARMED, CLOSED, TRIGGERED, FailureRateCircuitBreaker, \
    RepeatedFailuresOverTimeCircuitBreaker, breakers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_arms_on_failure_triggers_after_the_time_and_recovers(caplog):
    clock = Clock()
    triggered = []
    b = RepeatedFailuresOverTimeCircuitBreaker("test-fetch", time_to_trigger=30, clock=clock,
                                               on_trigger=triggered.append)
    assert b.state == CLOSED
    assert b.failure(OSError("down")) == 1.0 and b.state == ARMED
    clock.now += 29
    assert b.failure(OSError("down")) == 1.0 and b.state == ARMED
    clock.now += 1
    with caplog.at_level(logging.CRITICAL, logger="sluice.breakers"):
        assert b.failure(OSError("still down")) == 10.0
    assert b.state == TRIGGERED and len(triggered) == 1
    assert "TRIGGERED" in caplog.text
    assert b.failure(OSError("down")) == 10.0 and len(triggered) == 1  # triggers once
    assert any(s.name == "test-fetch" and s.state == TRIGGERED for s in breakers.snapshot())
    b.success()
    assert b.state == CLOSED and b.failures == 0


def test_a_success_between_failures_disarms():
    clock = Clock()
    b = RepeatedFailuresOverTimeCircuitBreaker("test-x", time_to_trigger=30, clock=clock)
    b.failure(OSError())
    clock.now += 20
    b.success()
    clock.now += 20
    b.failure(OSError())
    assert b.state == ARMED  # the clock restarted at the second failure


def test_failure_rate_breaker():
    clock = Clock()
    b = FailureRateCircuitBreaker("test-recovery", max_per_second=2, clock=clock)
    assert b.failure(ValueError()) == 0 and b.failure(ValueError()) == 0
    assert b.failure(ValueError()) == 1.0 and b.state == TRIGGERED
    clock.now += 2
    b.success()
    assert b.state == CLOSED
