"""``/api/alerts/…``: alerts (firing and history), rules, targets, silences, deliveries and
the JSON import, for viewers to read and operators to change (through dashboard.actions,
audited).  Targets never carry their URL, headers or routing key out: ``address`` is the
scheme and host only, ``has_headers`` / ``has_routing_key`` say whether one is set."""
from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.alerts.config import export_config
from core.alerts.models import Alert, AlertDelivery, AlertRule, AlertState, AlertTarget, Silence
from dashboard import actions
from dashboard.api.views import _act, _body, doc, int_param


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def alert_json(a: Alert) -> dict[str, Any]:
    return {"id": a.pk, "rule": a.rule.name, "fingerprint": a.fingerprint, "labels": a.labels, "state": a.state,
            "summary": a.summary, "value": a.value, "started_at": _iso(a.started_at), "fired_at": _iso(a.fired_at),
            "resolved_at": _iso(a.resolved_at), "notified": a.notified}


def rule_json(r: AlertRule) -> dict[str, Any]:
    return {"id": r.pk, "name": r.name, "kind": r.kind, "threshold": r.threshold, "window_seconds": r.window_seconds,
            "for_seconds": r.for_seconds, "clear_after": r.clear_after, "severity": r.severity, "filters": r.filters,
            "targets": [t.name for t in r.targets.all()], "enabled": r.enabled}


def target_json(t: AlertTarget) -> dict[str, Any]:
    return {"id": t.pk, "name": t.name, "format": t.format, "address": t.display_address,
            "has_headers": bool(t.headers), "has_routing_key": bool(t.routing_key), "max_per_hour": t.max_per_hour,
            "enabled": t.enabled}


def silence_json(s: Silence) -> dict[str, Any]:
    return {"id": s.pk, "rule": s.rule.name if s.rule else None, "matchers": s.matchers,
            "starts_at": _iso(s.starts_at), "ends_at": _iso(s.ends_at), "comment": s.comment, "created_by": s.created_by}


def delivery_json(d: AlertDelivery) -> dict[str, Any]:
    return {"id": d.pk, "target": d.target.name, "event": d.event, "rule": d.alert.rule.name if d.alert else None,
            "fingerprint": d.alert.fingerprint if d.alert else None, "status": d.status, "attempts": d.attempts,
            "last_error": d.last_error, "created_at": _iso(d.created_at), "finished_at": _iso(d.finished_at)}


class AlertList(APIView):
    @doc(summary="Firing and pending alerts, and the newest resolved ones")
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100)
        active = Alert.objects.filter(state__in=(AlertState.FIRING, AlertState.PENDING)).select_related("rule")
        history = Alert.objects.filter(state=AlertState.RESOLVED).select_related("rule").order_by("-resolved_at")
        return Response({"active": [alert_json(a) for a in active[:limit]],
                         "history": [alert_json(a) for a in history[:limit]]})


class RuleList(APIView):
    @doc(summary="Alert rules")
    def get(self, request: Request) -> Response:
        return Response({"rules": [rule_json(r) for r in AlertRule.objects.prefetch_related("targets")]})

    @doc(summary="Create (or, by name, update) a rule")
    def post(self, request: Request) -> Response:
        return _act(lambda: actions.save_alert_rule(request.user, _body(request), via="api"),
                    lambda r: {"saved": r.count, "audit_id": r.audit_id}, status.HTTP_201_CREATED)


class RuleItem(APIView):
    @doc(summary="Change a rule")
    def put(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.save_alert_rule(request.user, _body(request), pk, via="api"),
                    lambda r: {"saved": r.count})

    @doc(summary="Delete a rule and its alerts", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.delete_alert_rule(request.user, pk, via="api"), lambda r: {"deleted": r.count})


class TargetList(APIView):
    @doc(summary="Notification targets (secrets never returned)")
    def get(self, request: Request) -> Response:
        return Response({"targets": [target_json(t) for t in AlertTarget.objects.all()]})

    @doc(summary="Create (or, by name, update) a target")
    def post(self, request: Request) -> Response:
        data = _body(request)
        existing = AlertTarget.objects.filter(name=str(data.get("name", "")).strip()).values_list("pk", flat=True).first()
        return _act(lambda: actions.save_alert_target(request.user, data, existing, via="api"),
                    lambda r: {"saved": r.count}, status.HTTP_201_CREATED)


class TargetItem(APIView):
    @doc(summary="Change a target (an empty url / routing_key keeps the stored one)")
    def put(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.save_alert_target(request.user, _body(request), pk, via="api"),
                    lambda r: {"saved": r.count})

    @doc(summary="Delete a target", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.delete_alert_target(request.user, pk, via="api"), lambda r: {"deleted": r.count})


class TargetTest(APIView):
    @doc(summary="Queue a test notification to the target", request=None)
    def post(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.test_alert_target(request.user, pk, via="api"), lambda r: {"queued": r.count},
                    status.HTTP_202_ACCEPTED)


class SilenceList(APIView):
    @doc(summary="Silences and maintenance windows that have not ended")
    def get(self, request: Request) -> Response:
        current = Silence.objects.filter(ends_at__gt=timezone.now()).select_related("rule")
        return Response({"silences": [silence_json(s) for s in current]})

    @doc(summary="Silence a rule (or every rule) until a time: {rule, matchers, starts_at, ends_at | minutes, comment}")
    def post(self, request: Request) -> Response:
        return _act(lambda: actions.create_silence(request.user, _body(request), via="api"),
                    lambda r: {"created": r.count}, status.HTTP_201_CREATED)


class SilenceItem(APIView):
    @doc(summary="End a silence now", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return _act(lambda: actions.expire_silence(request.user, pk, via="api"), lambda r: {"ended": r.count})


class DeliveryList(APIView):
    @doc(summary="Notifications, newest first (failed ones with their reason)")
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100)
        rows = AlertDelivery.objects.select_related("target", "alert__rule")
        if request.query_params.get("status"):
            rows = rows.filter(status=request.query_params["status"])
        return Response({"deliveries": [delivery_json(d) for d in rows[:limit]]})


class ConfigImport(APIView):
    @doc(summary="Create or update rules and targets from {targets: [...], rules: [...]}")
    def post(self, request: Request) -> Response:
        return _act(lambda: actions.import_alerts(request.user, request.data, via="api"),
                    lambda r: {"imported": r.count, "detail": r.message})


class ConfigExport(APIView):
    @doc(summary="Rules and targets as the import takes them, secrets left out")
    def get(self, request: Request) -> Response:
        return Response(export_config())
