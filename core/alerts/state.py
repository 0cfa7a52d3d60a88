"""The life of an alert: pending → firing → resolved, one row per rule and labels.

- A breach starts a *pending* alert; it fires once the condition has held for the rule's
  ``for_seconds`` (at once when 0).  A pending alert whose condition clears is dropped
  unseen, so a blip shorter than ``for`` notifies nobody.
- A firing alert resolves only after ``clear_after`` consecutive clear evaluations; a
  breach in between starts the count again.  A flapping condition therefore stays one
  firing alert instead of a notification per flap.
- Pending and firing alerts are read once per evaluation (:func:`active_alerts`); a rule
  writes only what changed, so 50 rules over 100 queues cost a few statements when all is well.
- The row's ``fingerprint`` (the de-dup key) comes from the rule name and the labels, so
  the resolution carries the same key as the firing notification.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from core.models.alerts import Alert, AlertRule, AlertState
from core.alerts.rules import Breach

ACTIVE = (AlertState.PENDING, AlertState.FIRING)
UPDATED = ["value", "summary", "evaluated_at", "clear_count", "state", "fired_at", "resolved_at"]
#: A steady firing alert's value and evaluated_at are rewritten at most this often.
REFRESH = dt.timedelta(seconds=60)


def labels_for(rule: AlertRule, breach: Breach) -> dict[str, str]:
    return {"alertname": rule.name, "severity": rule.severity, **{k: str(v) for k, v in breach.labels.items()}}


def fingerprint(labels: dict[str, str]) -> str:
    """The first 32 hex digits of SHA-256 over the sorted ``name=value`` lines."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def active_alerts() -> dict[int, dict[str, Alert]]:
    """Every pending and firing alert, by rule and fingerprint (one query per evaluation)."""
    found: dict[int, dict[str, Alert]] = {}
    for alert in Alert.objects.filter(state__in=ACTIVE):
        found.setdefault(alert.rule_id, {})[alert.fingerprint] = alert
    return found


@dataclass
class Step:
    """What one evaluation does to one rule's alerts (worked out in memory first, so a rule
    where nothing changed costs no statement and no transaction)."""

    changed: list[Alert] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    #: Firing alerts not announced yet (new ones, and those a silence held back).
    firing: list[Alert] = field(default_factory=list)
    resolved: list[Alert] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not (self.changed or self.dropped or self.firing or self.resolved)


def advance(rule: AlertRule, found: list[Breach], now: dt.datetime, active: dict[str, Alert]) -> Step:
    """Apply one evaluation's breaches to the rule's ``active`` alerts, in memory (:func:`write`
    stores the result).  A steady firing alert is rewritten (value, evaluated_at) at most every
    :data:`REFRESH`."""
    step = Step()
    seen: set[str] = set()
    for breach in found:
        labels = labels_for(rule, breach)
        key = fingerprint(labels)
        if key in seen:
            continue
        seen.add(key)
        alert = active.get(key)
        if alert is None:
            alert = active[key] = Alert(rule=rule, fingerprint=key, labels=labels, started_at=now, evaluated_at=now)
        moved = alert.pk is None or alert.clear_count != 0 or now - alert.evaluated_at >= REFRESH
        alert.value, alert.summary, alert.clear_count = breach.value, breach.summary[:500], 0
        if alert.state == AlertState.PENDING and (now - alert.started_at).total_seconds() >= rule.for_seconds:
            alert.state, alert.fired_at, moved = AlertState.FIRING, now, True
        if moved:
            alert.evaluated_at = now
            step.changed.append(alert)
    for key, alert in list(active.items()):
        if key in seen:
            continue
        if alert.state == AlertState.PENDING:
            step.dropped.append(alert.pk)  # cleared before it had held for `for`: never fired, nobody told
            del active[key]
            continue
        alert.clear_count += 1
        alert.evaluated_at = now
        if alert.clear_count >= max(rule.clear_after, 1):
            alert.state, alert.resolved_at = AlertState.RESOLVED, now
            step.resolved.append(alert)
            del active[key]
        step.changed.append(alert)
    step.firing = [a for a in active.values() if a.state == AlertState.FIRING and not a.notified]
    return step


def write(step: Step) -> None:
    """Store a step: new alerts one by one (rare: a problem starting; each needs its id for
    deliveries), changed ones in one statement, dropped ones in another."""
    existing = [a for a in step.changed if a.pk is not None]
    for alert in step.changed:
        if alert.pk is None:
            alert.save()
    if existing:
        Alert.objects.bulk_update(existing, UPDATED, batch_size=500)
    if step.dropped:
        Alert.objects.filter(pk__in=step.dropped).delete()
