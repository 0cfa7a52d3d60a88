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

from core.alerts.models import Alert, AlertRule, AlertState
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


def advance(rule: AlertRule, found: list[Breach], now: dt.datetime,
            active: dict[str, Alert]) -> tuple[list[Alert], list[Alert]]:
    """Apply one evaluation's breaches to the rule's ``active`` alerts; returns (alerts that
    fire and were not announced yet, alerts that resolved).  Writes only what changed: a
    steady firing alert is rewritten (value, evaluated_at) at most every :data:`REFRESH`."""
    seen: set[str] = set()
    changed: list[Alert] = []
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
            changed.append(alert)
    resolved, dropped = [], []
    for key, alert in active.items():
        if key in seen:
            continue
        if alert.state == AlertState.PENDING:
            dropped.append(alert.pk)  # cleared before it had held for `for`: never fired, nobody told
            continue
        alert.clear_count += 1
        alert.evaluated_at = now
        if alert.clear_count >= max(rule.clear_after, 1):
            alert.state, alert.resolved_at = AlertState.RESOLVED, now
            resolved.append(alert)
        changed.append(alert)
    _write(changed, dropped)
    firing = [a for a in active.values() if a.state == AlertState.FIRING and not a.notified]
    return firing, resolved


def _write(changed: list[Alert], dropped: list[int | None]) -> None:
    """New alerts one by one (rare: a problem starting; each needs its id for deliveries),
    changed ones in one statement."""
    existing = [a for a in changed if a.pk is not None]
    for alert in changed:
        if alert.pk is None:
            alert.save()
    if existing:
        Alert.objects.bulk_update(existing, UPDATED, batch_size=500)
    dropped = [pk for pk in dropped if pk is not None]
    if dropped:
        Alert.objects.filter(pk__in=dropped).delete()
