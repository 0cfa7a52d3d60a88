"""``/api/alerts/…``: alerts (firing and history), rules, targets, silences, deliveries and
the JSON import, for viewers to read and operators to change (through dashboard.actions,
audited).  Targets never carry their URL, headers or routing key out: ``address`` is the
scheme and host only, ``has_headers`` / ``has_routing_key`` say whether one is set."""
from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from rest_framework import serializers as f
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core.alerts.config import export_config, finite
from core.alerts.sending import redact
from core.models.alerts import Alert, AlertDelivery, AlertRule, AlertState, AlertTarget, Silence
from dashboard import actions
from dashboard.api.schema import ERRORS_ACT, ERRORS_READ, doc, limit
from dashboard.api.params import act, int_param, request_object
from dashboard.api.base import SluiceAPIView


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def alert_json(a: Alert) -> dict[str, Any]:
    return {"id": a.pk, "rule": a.rule.name, "fingerprint": a.fingerprint, "labels": a.labels, "state": a.state,
            "summary": a.summary, "value": a.value, "started_at": _iso(a.started_at), "fired_at": _iso(a.fired_at),
            "resolved_at": _iso(a.resolved_at), "notified": a.notified}


def rule_json(r: AlertRule) -> dict[str, Any]:
    # finite(): null for an inf / nan stored before numbers were checked (JSON has neither).
    return {"id": r.pk, "name": r.name, "kind": r.kind, "threshold": finite(r.threshold),
            "window_seconds": finite(r.window_seconds), "for_seconds": finite(r.for_seconds),
            "clear_after": r.clear_after, "severity": r.severity, "filters": r.filters,
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
            "last_error": redact(d.last_error, d.target),  # rows stored before redaction covered the URL's parts
            "created_at": _iso(d.created_at), "finished_at": _iso(d.finished_at),
            "sending_until": _iso(d.sending_until)}


# -- response shapes (the OpenAPI schema; schemathesis checks answers against them) ----------------

def _when() -> f.DateTimeField:
    return f.DateTimeField(allow_null=True)


class AlertShape(f.Serializer):
    id = f.IntegerField()
    rule = f.CharField()
    fingerprint = f.CharField()
    labels = f.DictField()
    state = f.CharField()
    summary = f.CharField(allow_blank=True)
    value = f.FloatField(allow_null=True)
    started_at, fired_at, resolved_at = _when(), _when(), _when()
    notified = f.BooleanField()


class AlertsShape(f.Serializer):
    active = AlertShape(many=True)
    history = AlertShape(many=True)


class RuleShape(f.Serializer):
    id = f.IntegerField()
    name = f.CharField()
    kind = f.CharField()
    threshold = f.FloatField(allow_null=True)
    window_seconds = f.FloatField(allow_null=True)
    for_seconds = f.FloatField(allow_null=True)
    clear_after = f.IntegerField()
    severity = f.CharField()
    filters = f.DictField()
    targets = f.ListField(child=f.CharField())
    enabled = f.BooleanField()


class RulesShape(f.Serializer):
    rules = RuleShape(many=True)


class TargetShape(f.Serializer):
    id = f.IntegerField()
    name = f.CharField()
    format = f.CharField()
    address = f.CharField(allow_blank=True, help_text="Scheme and host only: never the path, token or key.")
    has_headers = f.BooleanField()
    has_routing_key = f.BooleanField()
    max_per_hour = f.IntegerField()
    enabled = f.BooleanField()


class TargetsShape(f.Serializer):
    targets = TargetShape(many=True)


class SilenceShape(f.Serializer):
    id = f.IntegerField()
    rule = f.CharField(allow_null=True)
    matchers = f.DictField()
    starts_at, ends_at = _when(), _when()
    comment = f.CharField(allow_blank=True)
    created_by = f.CharField(allow_blank=True)


class SilencesShape(f.Serializer):
    silences = SilenceShape(many=True)


class DeliveryShape(f.Serializer):
    id = f.IntegerField()
    target = f.CharField()
    event = f.CharField()
    rule = f.CharField(allow_null=True)
    fingerprint = f.CharField(allow_null=True)
    status = f.CharField()
    attempts = f.IntegerField()
    last_error = f.CharField(allow_blank=True)
    created_at, finished_at = _when(), _when()
    #: The deadline of the attempt under way (status ``sending``).
    sending_until = _when()


class DeliveriesShape(f.Serializer):
    deliveries = DeliveryShape(many=True)


class Saved(f.Serializer):
    saved = f.IntegerField()
    audit_id = f.IntegerField(required=False, allow_null=True)


class Count(f.Serializer):
    """``deleted``, ``queued``, ``created`` or ``ended``: how many things the action changed."""

    deleted = f.IntegerField(required=False)
    queued = f.IntegerField(required=False)
    created = f.IntegerField(required=False)
    ended = f.IntegerField(required=False)


class Imported(f.Serializer):
    imported = f.IntegerField()
    detail = f.CharField(allow_blank=True)


class Config(f.Serializer):
    targets = f.ListField(child=f.DictField())
    rules = f.ListField(child=f.DictField())


class AlertList(SluiceAPIView):
    @doc(AlertsShape, summary="Firing and pending alerts, and the newest resolved ones", parameters=[limit(100, 500)])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100)
        active = Alert.objects.filter(state__in=(AlertState.FIRING, AlertState.PENDING)).select_related("rule")
        history = Alert.objects.filter(state=AlertState.RESOLVED).select_related("rule").order_by("-resolved_at")
        return Response({"active": [alert_json(a) for a in active[:limit]],
                         "history": [alert_json(a) for a in history[:limit]]})


class RuleList(SluiceAPIView):
    audit_action = "save_alert_rule"

    @doc(RulesShape, summary="Alert rules")
    def get(self, request: Request) -> Response:
        return Response({"rules": [rule_json(r) for r in AlertRule.objects.prefetch_related("targets")]})

    @doc(Saved, code=201, errors=ERRORS_ACT, summary="Create (or, by name, update) a rule", request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        return act(lambda: actions.save_alert_rule(request.user, request_object(request), via="api"),
                    lambda r: {"saved": r.count, "audit_id": r.audit_id}, status.HTTP_201_CREATED)


class RuleItem(SluiceAPIView):
    audit_action = "save_alert_rule"

    @doc(Saved, errors=ERRORS_ACT, summary="Change a rule", request=OpenApiTypes.OBJECT)
    def put(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.save_alert_rule(request.user, request_object(request), pk, via="api"),
                    lambda r: {"saved": r.count})

    @doc(Count, errors=ERRORS_ACT, summary="Delete a rule and its alerts", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.delete_alert_rule(request.user, pk, via="api"), lambda r: {"deleted": r.count})


class TargetList(SluiceAPIView):
    audit_action = "save_alert_target"

    @doc(TargetsShape, summary="Notification targets (secrets never returned)")
    def get(self, request: Request) -> Response:
        return Response({"targets": [target_json(t) for t in AlertTarget.objects.all()]})

    @doc(Saved, code=201, errors=ERRORS_ACT, summary="Create (or, by name, update) a target", request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        data = request_object(request)
        existing = AlertTarget.objects.filter(name=str(data.get("name", "")).strip()).values_list("pk", flat=True).first()
        return act(lambda: actions.save_alert_target(request.user, data, existing, via="api"),
                    lambda r: {"saved": r.count}, status.HTTP_201_CREATED)


class TargetItem(SluiceAPIView):
    audit_action = "save_alert_target"

    @doc(Saved, errors=ERRORS_ACT, summary="Change a target (an empty url / routing_key keeps the stored one)", request=OpenApiTypes.OBJECT)
    def put(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.save_alert_target(request.user, request_object(request), pk, via="api"),
                    lambda r: {"saved": r.count})

    @doc(Count, errors=ERRORS_ACT, summary="Delete a target", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.delete_alert_target(request.user, pk, via="api"), lambda r: {"deleted": r.count})


class TargetTest(SluiceAPIView):
    audit_action = "test_alert_target"

    @doc(Count, code=202, errors=ERRORS_ACT, summary="Queue a test notification to the target", request=None)
    def post(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.test_alert_target(request.user, pk, via="api"), lambda r: {"queued": r.count},
                    status.HTTP_202_ACCEPTED)


class SilenceList(SluiceAPIView):
    audit_action = "create_silence"

    @doc(SilencesShape, summary="Silences and maintenance windows that have not ended")
    def get(self, request: Request) -> Response:
        current = Silence.objects.filter(ends_at__gt=timezone.now()).select_related("rule")
        return Response({"silences": [silence_json(s) for s in current]})

    @doc(Count, code=201, errors=ERRORS_ACT,
         summary="Silence a rule (or every rule) until a time: {rule, matchers, starts_at, ends_at | minutes, comment}", request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        return act(lambda: actions.create_silence(request.user, request_object(request), via="api"),
                    lambda r: {"created": r.count}, status.HTTP_201_CREATED)


class SilenceItem(SluiceAPIView):
    audit_action = "expire_silence"

    @doc(Count, errors=ERRORS_ACT, summary="End a silence now", request=None)
    def delete(self, request: Request, pk: int) -> Response:
        return act(lambda: actions.expire_silence(request.user, pk, via="api"), lambda r: {"ended": r.count})


class DeliveryList(SluiceAPIView):
    @doc(DeliveriesShape, summary="Notifications, newest first (failed ones with their reason)",
         parameters=[limit(100, 500)])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100)
        rows = AlertDelivery.objects.select_related("target", "alert__rule")
        if request.query_params.get("status"):
            rows = rows.filter(status=request.query_params["status"])
        return Response({"deliveries": [delivery_json(d) for d in rows[:limit]]})


class ConfigImport(SluiceAPIView):
    audit_action = "import_alerts"

    @doc(Imported, errors=ERRORS_ACT, summary="Create or update rules and targets from {targets: [...], rules: [...]}", request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        return act(lambda: actions.import_alerts(request.user, request.data, via="api"),
                    lambda r: {"imported": r.count, "detail": r.message})


class ConfigExport(SluiceAPIView):
    @doc(Config, errors=ERRORS_READ, summary="Rules and targets as the import takes them, secrets left out")
    def get(self, request: Request) -> Response:
        return Response(export_config())
