"""The alert evaluator: a loop (core.runtime.loops) that evaluates every enabled rule each
``SLUICE_ALERTS_INTERVAL`` seconds.

Every worker hosts one, but only the holder of the ``alerts-evaluator`` lease evaluates
(as with the delayed mover), so a rule is never evaluated twice at once and a worker
that dies hands over within a lease.  With no enabled rule a step reads one row and
takes no lease.  Each rule is applied in its own transaction with the notifications it
causes; a rule whose measurement fails is skipped this round (logged), the others go on.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, transaction

from core.models.alerts import AlertRule
from core.alerts.notify import active_silences, announce_rule_events
from core.alerts.rules import Readings, breaches
from core.alerts.state import active_alerts, advance, write
from core.conf import get_settings
from core.runtime.lease import Lease

log = logging.getLogger("sluice.alerts")

LEASE_NAME = "alerts-evaluator"


@dataclass
class Evaluation:
    rules: int = 0
    notifications: int = 0
    #: Rule name → why it could not be evaluated this round.
    errors: dict[str, str] = field(default_factory=dict)
    ms: float = 0.0


def evaluate(rules: list[AlertRule] | None = None) -> Evaluation:
    """Evaluate the rules (every enabled one by default) once, now."""
    started = time.perf_counter()
    rules = list(AlertRule.objects.filter(enabled=True)) if rules is None else rules
    readings = Readings()
    silences = active_silences(readings.now)
    active = active_alerts()
    result = Evaluation(rules=len(rules))
    using = get_settings().DATABASE
    for rule in rules:
        try:
            step = advance(rule, breaches(rule, readings), readings.now, active.setdefault(rule.pk, {}))
            if step.idle:
                continue  # all as before: no statement, no transaction
            with transaction.atomic(using=using):
                write(step)
                result.notifications += announce_rule_events(rule, step.firing, step.resolved, readings.now,
                                                             silences)
        except DatabaseError as exc:
            result.errors[rule.name] = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("alert rule %s not evaluated: %s", rule.name, result.errors[rule.name])
    result.ms = (time.perf_counter() - started) * 1000
    return result


class AlertEvaluator:
    """The loop (see the module doc)."""

    name = "alerts"

    def __init__(self, interval: float | None = None, lease_seconds: float | None = None) -> None:
        s = get_settings()
        self.interval = interval or s.ALERTS_INTERVAL
        self.lease = Lease(LEASE_NAME, lease_seconds or max(s.ALERTS_LEASE_SECONDS, self.interval * 2), s.DATABASE)
        self.last: Evaluation | None = None

    def step(self) -> float:
        if not AlertRule.objects.filter(enabled=True).exists():
            return self.interval
        if not self.lease.acquire():
            return min(self.interval, self.lease.follower_wait())
        self.last = evaluate()
        if self.last.errors:
            log.info("alerts evaluated in %.0f ms; %d rule(s) skipped", self.last.ms, len(self.last.errors))
        return self.interval

    def close(self) -> None:
        try:
            self.lease.release()
        except DatabaseError:
            pass  # it lapses by itself
