"""``/alerts/``: firing alerts, rules, targets (secrets never shown), silences, deliveries and
history; operators add and change them with plain forms (each an audited action)."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, QueryDict
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from core.models.alerts import (
    Alert,
    AlertDelivery,
    AlertRule,
    AlertState,
    AlertTarget,
    RuleKind,
    Severity,
    Silence,
    TargetFormat,
)
from core.alerts.notify import active_silences, silenced
from core.alerts.sending import redact
from dashboard import actions
from dashboard.actions import validate
from dashboard.security.permissions import viewer_required
from dashboard.views.common import act, operator_only, page

#: Rows per list (history and deliveries: the newest).
LIMIT = 50
FILTER_FIELDS = ("queue", "worker", "breaker", "message_type", "exception_type")


def _pairs(text: str, sep: str) -> dict[str, str]:
    """``name<sep>value`` lines as a dict (blank lines skipped)."""
    pairs = {}
    for line in text.splitlines():
        if line.strip():
            name, _, value = line.partition(sep)
            pairs[name.strip()] = value.strip()
    return pairs


def rule_from_form(post: QueryDict) -> dict[str, Any]:
    filters: dict[str, Any] = {k: post.get(k, "").strip() for k in FILTER_FIELDS if post.get(k, "").strip()}
    header = _pairs(post.get("header", ""), "=")
    if header:
        filters["header"] = header
    return {"name": post.get("name", ""), "kind": post.get("kind", ""), "threshold": post.get("threshold", "0"),
            "window_seconds": post.get("window_seconds", "300"), "for_seconds": post.get("for_seconds", "0"),
            "clear_after": post.get("clear_after", "3"), "severity": post.get("severity", Severity.WARNING),
            "filters": filters, "targets": post.getlist("targets"), "enabled": post.get("enabled", "on") == "on"}


def target_from_form(post: QueryDict) -> dict[str, Any]:
    return {"name": post.get("name", ""), "format": post.get("format", ""), "url": post.get("url", ""),
            "recipients": post.get("recipients", ""), "routing_key": post.get("routing_key", ""),
            "headers": _pairs(post.get("headers", ""), ":"), "max_per_hour": post.get("max_per_hour", "60"),
            "enabled": post.get("enabled", "on") == "on"}


@viewer_required
@require_GET
def alerts(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    silences = active_silences(now)
    active = list(Alert.objects.filter(state__in=(AlertState.FIRING, AlertState.PENDING)).select_related("rule")
                  .order_by("-started_at")[:200])
    return page(request, "dashboard/alerts.html", {
        "section": "alerts",
        "active": [(a, silenced(a, silences, now)) for a in active],
        "history": Alert.objects.filter(state=AlertState.RESOLVED).select_related("rule").order_by("-resolved_at")[:LIMIT],
        "rules": AlertRule.objects.prefetch_related("targets"),
        "targets": AlertTarget.objects.all(),
        "silences": Silence.objects.filter(ends_at__gt=now).select_related("rule"),
        "deliveries": _redacted(AlertDelivery.objects.select_related("target", "alert__rule")[:LIMIT]),
        "kinds": RuleKind.choices, "severities": Severity.choices, "formats": TargetFormat.choices,
    })


def _redacted(deliveries: Any) -> list[AlertDelivery]:
    """Deliveries with their errors redacted again as shown (not saved): a row stored before
    redaction covered every part of the target's URL must not show it either."""
    rows = list(deliveries)
    for d in rows:
        d.last_error = redact(d.last_error, d.target)
    return rows


def _back() -> str:
    return reverse("dashboard:alerts")


@operator_only("save_alert_rule")
@require_POST
def rule_save(request: HttpRequest) -> HttpResponse:
    return act(request, lambda: actions.save_alert_rule(request.user, rule_from_form(request.POST), via="web"), _back())


@operator_only("delete_alert_rule")
@require_POST
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    return act(request, lambda: actions.delete_alert_rule(request.user, pk, via="web"), _back())


@operator_only("save_alert_target")
@require_POST
def target_save(request: HttpRequest) -> HttpResponse:
    existing = AlertTarget.objects.filter(name=request.POST.get("name", "").strip()).values_list("pk", flat=True).first()
    return act(request, lambda: actions.save_alert_target(request.user, target_from_form(request.POST), existing,
                                                          via="web"), _back())


@operator_only("delete_alert_target")
@require_POST
def target_delete(request: HttpRequest, pk: int) -> HttpResponse:
    return act(request, lambda: actions.delete_alert_target(request.user, pk, via="web"), _back())


@operator_only("test_alert_target")
@require_POST
def target_test(request: HttpRequest, pk: int) -> HttpResponse:
    return act(request, lambda: actions.test_alert_target(request.user, pk, via="web"), _back())


@operator_only("create_silence")
@require_POST
def silence_create(request: HttpRequest) -> HttpResponse:
    data = {"rule": request.POST.get("rule", ""), "starts_at": request.POST.get("starts_at", ""),
            "ends_at": request.POST.get("ends_at", ""), "minutes": request.POST.get("minutes", "60"),
            "comment": request.POST.get("comment", ""), "matchers": _pairs(request.POST.get("matchers", ""), "=")}
    return act(request, lambda: actions.create_silence(request.user, data, via="web"), _back())


@operator_only("expire_silence")
@require_POST
def silence_expire(request: HttpRequest, pk: int) -> HttpResponse:
    return act(request, lambda: actions.expire_silence(request.user, pk, via="web"), _back())


@operator_only("import_alerts")
@require_POST
def import_config(request: HttpRequest) -> HttpResponse:
    def run():
        data = validate.load_json(request.POST.get("config", ""), "the configuration")
        return actions.import_alerts(request.user, data, via="web")

    return act(request, run, _back())
