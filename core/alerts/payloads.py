"""What a notification says, per target format: the Prometheus Alertmanager v2 alert list
(the default: it plugs into existing Alertmanager routing), Slack, Microsoft Teams,
PagerDuty Events v2, and email.  Firing and resolved notifications of one alert carry the
same labels and ``dedup_key``; a resolved Alertmanager alert has ``endsAt``."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from core.models.alerts import Alert, AlertTarget, TargetFormat
from core.conf import get_settings

SEVERITY_PAGERDUTY = {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


@dataclass(frozen=True)
class Notice:
    """The format-independent facts of one notification."""

    event: str  # firing / resolved / test
    labels: dict[str, str]
    summary: str
    dedup_key: str
    starts_at: dt.datetime
    ends_at: dt.datetime | None

    @property
    def title(self) -> str:
        state = {"firing": "FIRING", "resolved": "RESOLVED"}.get(self.event, "TEST")
        return f"[{state}] {self.labels.get('alertname', 'sluice')}: {self.summary}"[:300]


def notice(alert: Alert | None, event: str, now: dt.datetime) -> Notice:
    if alert is None:
        return Notice("test", {"alertname": "SluiceTestNotification", "severity": "info"},
                      "a test notification from Sluice: this target works", "sluice-test-" + now.strftime("%Y%m%d%H%M%S"),
                      now, None)
    return Notice(event, dict(alert.labels), alert.summary, alert.fingerprint, alert.fired_at or alert.started_at,
                  alert.resolved_at if event == "resolved" else None)


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def alertmanager(n: Notice) -> list[dict[str, Any]]:
    """``POST /api/v2/alerts``: a list of alerts; a firing one has no ``endsAt``."""
    alert: dict[str, Any] = {
        "labels": {**n.labels, "sluice_endpoint": get_settings().ENDPOINT},
        "annotations": {"summary": n.summary, "description": n.summary, "dedup_key": n.dedup_key},
        "startsAt": _iso(n.starts_at),
    }
    if n.ends_at is not None:
        alert["endsAt"] = _iso(n.ends_at)
    if get_settings().ALERTS_DASHBOARD_URL:
        alert["generatorURL"] = get_settings().ALERTS_DASHBOARD_URL.rstrip("/") + "/alerts/"
    return [alert]


def slack(n: Notice) -> dict[str, Any]:
    scope = ", ".join(f"{k}={v}" for k, v in n.labels.items() if k not in ("alertname", "severity"))
    return {"text": f"{n.title}" + (f" ({scope})" if scope else "")}


def teams(n: Notice) -> dict[str, Any]:
    """A Teams workflow webhook message with one Adaptive Card."""
    facts = [{"title": k, "value": v} for k, v in n.labels.items()]
    return {"type": "message", "attachments": [{
        "contentType": "application/vnd.microsoft.card.adaptive",
        "content": {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                    "version": "1.4", "body": [
                        {"type": "TextBlock", "text": n.title, "weight": "Bolder", "wrap": True},
                        {"type": "FactSet", "facts": facts}]}}]}


def pagerduty(n: Notice, routing_key: str) -> dict[str, Any]:
    """Events API v2: trigger, then resolve with the same ``dedup_key``."""
    return {
        "routing_key": routing_key,
        "event_action": "resolve" if n.event == "resolved" else "trigger",
        "dedup_key": n.dedup_key,
        "payload": {"summary": n.title[:1024], "source": get_settings().ENDPOINT,
                    "severity": SEVERITY_PAGERDUTY.get(n.labels.get("severity", ""), "warning"),
                    "timestamp": _iso(n.starts_at), "custom_details": n.labels},
    }


def webhook_body(target: AlertTarget, n: Notice) -> Any:
    if target.format == TargetFormat.SLACK:
        return slack(n)
    if target.format == TargetFormat.TEAMS:
        return teams(n)
    if target.format == TargetFormat.PAGERDUTY:
        return pagerduty(n, target.routing_key)
    return alertmanager(n)


def email_text(n: Notice) -> tuple[str, str]:
    """(subject, body) of an email notification."""
    lines = [n.summary, "", *(f"{k}: {v}" for k, v in n.labels.items()), f"dedup key: {n.dedup_key}",
             f"since: {_iso(n.starts_at)}"]
    if n.ends_at is not None:
        lines.append(f"resolved: {_iso(n.ends_at)}")
    if get_settings().ALERTS_DASHBOARD_URL:
        lines += ["", get_settings().ALERTS_DASHBOARD_URL.rstrip("/") + "/alerts/"]
    return n.title, "\n".join(lines) + "\n"
