"""The life of an alert: pending → firing → resolved, one row per rule and labels.

- A breach starts a *pending* alert; it fires once the condition has held for the rule's
  ``for_seconds`` (at once when 0).  A pending alert whose condition clears is dropped
  unseen, so a blip shorter than ``for`` notifies nobody.
- A firing alert resolves only after ``clear_after`` consecutive clear evaluations; a
  breach in between starts the count again.  A flapping condition therefore stays one
  firing alert instead of a notification per flap.
- The row's ``fingerprint`` (the de-dup key) comes from the rule name and the labels, so
  the resolution carries the same key as the firing notification.
"""
from __future__ import annotations

import datetime as dt
import hashlib

from core.alerts.models import Alert, AlertRule, AlertState
from core.alerts.rules import Breach

ACTIVE = (AlertState.PENDING, AlertState.FIRING)


def labels_for(rule: AlertRule, breach: Breach) -> dict[str, str]:
    return {"alertname": rule.name, "severity": rule.severity, **{k: str(v) for k, v in breach.labels.items()}}


def fingerprint(labels: dict[str, str]) -> str:
    """The first 32 hex digits of SHA-256 over the sorted ``name=value`` lines."""
    text = "\n".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def advance(rule: AlertRule, found: list[Breach], now: dt.datetime) -> list[Alert]:
    """Apply one evaluation's breaches to the rule's alerts; returns the alerts that resolved
    (those that fire are found by :func:`unannounced`, which also covers a silence ending)."""
    active = {a.fingerprint: a for a in Alert.objects.filter(rule=rule, state__in=ACTIVE)}
    seen: set[str] = set()
    for breach in found:
        labels = labels_for(rule, breach)
        key = fingerprint(labels)
        if key in seen:
            continue
        seen.add(key)
        alert = active.get(key) or Alert(rule=rule, fingerprint=key, labels=labels, started_at=now)
        alert.value, alert.summary, alert.evaluated_at, alert.clear_count = breach.value, breach.summary[:500], now, 0
        if alert.state == AlertState.PENDING and (now - alert.started_at).total_seconds() >= rule.for_seconds:
            alert.state, alert.fired_at = AlertState.FIRING, now
        alert.save()
    resolved = []
    for key, alert in active.items():
        if key in seen:
            continue
        if alert.state == AlertState.PENDING:
            alert.delete()  # cleared before it had held for `for`: never fired, nobody told
            continue
        alert.clear_count += 1
        alert.evaluated_at = now
        if alert.clear_count >= max(rule.clear_after, 1):
            alert.state, alert.resolved_at = AlertState.RESOLVED, now
            resolved.append(alert)
        alert.save(update_fields=["clear_count", "evaluated_at", "state", "resolved_at"])
    return resolved


def unannounced(rule: AlertRule) -> list[Alert]:
    """Firing alerts of the rule whose firing notification has not gone out yet."""
    return list(Alert.objects.filter(rule=rule, state=AlertState.FIRING, notified=False))
