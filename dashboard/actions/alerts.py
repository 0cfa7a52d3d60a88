"""Operator actions on alerting: rules, targets, silences, test notifications, JSON import.
Validation is core.alerts.config's (the same for the page, the API and the CLI); every
change is audited, and no audit entry ever holds a target's URL, headers or routing key."""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.alerts.config import (
    ConfigError, clean_rule, clean_target, import_config, moves_server, save_rule, save_target,
)
from core.models.alerts import AlertRule, AlertTarget, Silence
from core.alerts.notify import test_notification
from core.conf import get_settings
from dashboard.actions.audit import acting
from dashboard.actions.errors import ActionError
from dashboard.actions.result import ActionResult

#: The longest silence an operator can set in one go (30 days).
MAX_SILENCE = dt.timedelta(days=30)
#: How far from now a silence may start or end.
MAX_SILENCE_AHEAD = dt.timedelta(days=366)


def _get(model: Any, pk: Any, what: str) -> Any:
    try:
        found = model.objects.filter(pk=int(pk)).first()
    except (TypeError, ValueError):
        found = None
    if found is None:
        raise ActionError(f"no {what} #{pk}", 404)
    return found


def _checked(clean: Any, data: Any) -> dict[str, Any]:
    try:
        return clean(data)
    except ConfigError as exc:
        raise ActionError(str(exc)) from None


def save_alert_rule(user: Any, data: dict[str, Any], pk: int | None = None, *, via: str = "") -> ActionResult:
    with acting(user, "save_alert_rule", via, target=f"alert rule {data.get('name', '?')}") as audit:
        if pk is not None:
            _get(AlertRule, pk, "alert rule")
        clean = _checked(clean_rule, data)
        try:
            with transaction.atomic(using=get_settings().DATABASE):
                rule = save_rule(clean, pk)
        except ConfigError as exc:
            raise ActionError(str(exc)) from None
        audit.ids = [str(rule.pk)]
        audit.detail = f"{'updated' if pk else 'saved'}: {rule.kind}, threshold {rule.threshold:g}, filters {rule.filters}"
    return ActionResult("save_alert_rule", 1, f"alert rule {rule.name} saved", audit_id=audit.entry_id)


def _delete(user: Any, model: Any, pk: Any, action: str, what: str, via: str) -> ActionResult:
    with acting(user, action, via, target=f"{what} #{pk}") as audit:
        found = _get(model, pk, what)
        audit.target, audit.ids = f"{what} {found.name}", [str(found.pk)]
        found.delete()
    return ActionResult(action, 1, f"{what} {found.name} deleted", audit_id=audit.entry_id)


def delete_alert_rule(user: Any, pk: Any, *, via: str = "") -> ActionResult:
    """Delete a rule with its alerts and their deliveries."""
    return _delete(user, AlertRule, pk, "delete_alert_rule", "alert rule", via)


def save_alert_target(user: Any, data: dict[str, Any], pk: int | None = None, *, via: str = "") -> ActionResult:
    with acting(user, "save_alert_target", via, target=f"alert target {data.get('name', '?')}") as audit:
        existing = _get(AlertTarget, pk, "alert target") if pk is not None else None
        dropped = False
        if existing is not None:
            # A form never shows the stored secrets: left empty, they are kept — on the same
            # server only (core.alerts.config.save_target): a new one must be given them again.
            moved = moves_server({"url": data.get("url") if isinstance(data.get("url"), str) else ""}, existing)
            dropped = moved and bool(existing.routing_key or existing.headers)
            data = {**data, "url": data.get("url") or existing.url,
                    "routing_key": data.get("routing_key") or ("" if moved else existing.routing_key)}
        target = save_target(_checked(clean_target, data), pk)
        audit.ids = [str(target.pk)]
        audit.detail = f"{target.format} → {target.display_address}" + \
            (" (new server: the stored routing key and headers were dropped)" if dropped else "")
    return ActionResult("save_alert_target", 1, f"alert target {target.name} saved", audit_id=audit.entry_id)


def delete_alert_target(user: Any, pk: Any, *, via: str = "") -> ActionResult:
    return _delete(user, AlertTarget, pk, "delete_alert_target", "alert target", via)


def test_alert_target(user: Any, pk: Any, *, via: str = "") -> ActionResult:
    """Queue a test notification to one target (the delivery shows on the Alerts page)."""
    with acting(user, "test_alert_target", via, target=f"alert target #{pk}") as audit:
        target = _get(AlertTarget, pk, "alert target")
        audit.target = f"alert target {target.name}"
        with transaction.atomic(using=get_settings().DATABASE):
            delivery = test_notification(target, timezone.now())
        audit.ids = [str(delivery.pk)]
    return ActionResult("test_alert_target", 1, f"test notification to {target.name} queued",
                        audit_id=audit.entry_id)


def _when(value: Any, what: str) -> dt.datetime | None:
    if value in (None, ""):
        return None
    try:
        when = dt.datetime.fromisoformat(str(value))
        when = (when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)).astimezone(dt.timezone.utc)
    except (ValueError, OverflowError):
        raise ActionError(f"{what} must be an ISO time such as 2026-11-26T02:00") from None
    # Year 9999 (or 0001) overflows the arithmetic a silence needs, and no maintenance window
    # is planned that far off.
    if abs(when - timezone.now()) > MAX_SILENCE_AHEAD:
        raise ActionError(f"{what} must be within a year of now")
    return when


def create_silence(user: Any, data: dict[str, Any], *, via: str = "") -> ActionResult:
    """Silence one rule (or every rule: a maintenance window) from ``starts_at`` (default now)
    until ``ends_at`` or for ``minutes``; ``matchers`` narrows it to alerts with those labels."""
    with acting(user, "create_silence", via, target="alert silence") as audit:
        rule = _get(AlertRule, data["rule"], "alert rule") if data.get("rule") not in (None, "") else None
        starts = _when(data.get("starts_at"), "starts_at") or timezone.now()
        ends = _when(data.get("ends_at"), "ends_at")
        if ends is None:
            try:
                minutes = float(data.get("minutes") or 0)
            except (TypeError, ValueError, OverflowError):
                raise ActionError("minutes must be a number") from None
            # nan, inf and 1e300 make no timedelta (a 500): refused with the limit's reason.
            if not 0 < minutes <= MAX_SILENCE.total_seconds() / 60:
                raise ActionError("a silence must end after it starts, and last at most 30 days")
            ends = starts + dt.timedelta(minutes=minutes)
        if not starts < ends <= starts + MAX_SILENCE:
            raise ActionError("a silence must end after it starts, and last at most 30 days")
        matchers = data.get("matchers") or {}
        if not isinstance(matchers, dict) or not all(isinstance(v, str) for v in matchers.values()):
            raise ActionError("matchers must map label names to text")
        silence = Silence.objects.create(rule=rule, matchers=matchers, starts_at=starts, ends_at=ends,
                                         comment=str(data.get("comment", ""))[:500],
                                         created_by=getattr(user, "username", ""))
        scope = f"rule {rule.name}" if rule else "every rule"
        audit.target, audit.ids = f"silence of {scope} {matchers or ''}".strip(), [str(silence.pk)]
        audit.detail = f"{starts:%Y-%m-%d %H:%M} → {ends:%Y-%m-%d %H:%M} UTC: {silence.comment}"
    return ActionResult("create_silence", 1, f"{scope} silenced until {ends:%Y-%m-%d %H:%M} UTC",
                        audit_id=audit.entry_id)


def expire_silence(user: Any, pk: Any, *, via: str = "") -> ActionResult:
    with acting(user, "expire_silence", via, target=f"silence #{pk}") as audit:
        silence = _get(Silence, pk, "silence")
        now = timezone.now()
        silence.ends_at = max(min(silence.ends_at, now), silence.starts_at)
        silence.save(update_fields=["ends_at"])
        audit.ids = [str(silence.pk)]
    return ActionResult("expire_silence", 1, "silence ended", audit_id=audit.entry_id)


def import_alerts(user: Any, data: Any, *, via: str = "") -> ActionResult:
    with acting(user, "import_alerts", via, target="alert rules and targets") as audit:
        try:
            counts = import_config(data)
        except ConfigError as exc:
            raise ActionError(f"nothing imported: {exc}") from None
        audit.detail = f"{counts['rules']} rule(s), {counts['targets']} target(s)"
    return ActionResult("import_alerts", counts["rules"] + counts["targets"], f"imported {audit.detail}",
                        audit_id=audit.entry_id)
