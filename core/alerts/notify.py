"""Turning alert events into deliveries: silences, the per-target rate limit, and one
message on the alerts queue per target and alert (core.alerts.delivery sends it).

The delivery row and its message are written in one transaction with the alert's state,
so an evaluation that fails half-way leaves neither an announced alert without its
messages nor messages for an alert that was rolled back.
"""
from __future__ import annotations

import datetime as dt
import logging

from core.models.alerts import Alert, AlertDelivery, AlertRule, AlertTarget, DeliveryStatus, Silence
from core.conf import get_settings
from core.errors import UnknownQueue
from core.queues import create_queue, registry
from core.transport import Transport

log = logging.getLogger("sluice.alerts")

#: The type of the alerts queue's messages (each names a delivery and an attempt).
MESSAGE_TYPE = "Sluice.AlertDelivery"
#: The rate-limit window per target.
RATE_WINDOW = dt.timedelta(hours=1)


def active_silences(now: dt.datetime) -> list[Silence]:
    return list(Silence.objects.filter(starts_at__lte=now, ends_at__gt=now))


def silenced(alert: Alert, silences: list[Silence], now: dt.datetime) -> bool:
    return any(s.matches(alert.rule_id, alert.labels, now) for s in silences)


def targets_of(rule: AlertRule) -> list[AlertTarget]:
    chosen = list(rule.targets.filter(enabled=True))
    return chosen or list(AlertTarget.objects.filter(enabled=True))


def announce(alert: Alert | None, targets: list[AlertTarget], event: str, now: dt.datetime) -> list[AlertDelivery]:
    """One delivery per target: queued, or recorded as rate-limited when the target has had
    its ``max_per_hour`` (test notifications count too, and are never limited)."""
    made = []
    for target in targets:
        delivery = AlertDelivery(alert=alert, target=target, event=event)
        if event != "test" and target.max_per_hour > 0 and AlertDelivery.objects.filter(
                target=target, created_at__gte=now - RATE_WINDOW).exclude(
                status=DeliveryStatus.RATE_LIMITED).count() >= target.max_per_hour:
            delivery.status, delivery.finished_at = DeliveryStatus.RATE_LIMITED, now
            delivery.save()
            log.warning("alert %s %s: not sent to %s, which had %d notifications this hour",
                        alert.rule.name if alert else "test", event, target.name, target.max_per_hour)
        else:
            delivery.save()
            send_delivery(delivery.pk)
        made.append(delivery)
    return made


def alerts_queue() -> str:
    """The alerts queue's name, made on first need (it is Sluice's own)."""
    name = get_settings().ALERTS_QUEUE
    try:
        registry.get(name)
    except UnknownQueue:
        create_queue(name)
    return name


def send_delivery(delivery_id: int) -> None:
    """Put one delivery's first attempt on the alerts queue (in the caller's transaction)."""
    Transport(get_settings().DATABASE).send(alerts_queue(), {"delivery": delivery_id, "attempt": 1},
                                            message_type=MESSAGE_TYPE)


def announce_rule_events(rule: AlertRule, firing: list[Alert], resolved: list[Alert], now: dt.datetime,
                         silences: list[Silence]) -> int:
    """Notify the rule's targets of new firing alerts (unless silenced: they are announced
    when the silence ends, if still firing) and of resolutions of announced ones."""
    targets: list[AlertTarget] | None = None
    sent = 0
    for alert in firing:
        if silenced(alert, silences, now):
            continue
        targets = targets if targets is not None else targets_of(rule)
        announce(alert, targets, "firing", now)
        Alert.objects.filter(pk=alert.pk).update(notified=True)
        sent += 1
    for alert in resolved:
        if alert.notified:
            targets = targets if targets is not None else targets_of(rule)
            announce(alert, targets, "resolved", now)
            sent += 1
    return sent


def test_notification(target: AlertTarget, now: dt.datetime) -> AlertDelivery:
    """A "does this target work?" notification (the page's button)."""
    return announce(None, [target], "test", now)[0]
