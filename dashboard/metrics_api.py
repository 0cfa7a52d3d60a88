"""``GET /api/metrics/``: the analytics pipeline's metric windows, as JSON.

    /api/metrics/?queue=&message_type=&window=60|3600&since=ISO
    → {"windows": [{"queue", "message_type", "window_start", "window_seconds", "messages",
                    "throughput_per_s", "processing_ms_p50", "processing_ms_p95",
                    "processing_ms_p99", "critical_ms_p99", "failure_rate", "retries",
                    "expired", "dead_lettered"}, …],
       "last_run": {…} | null}

Session or ``Authorization: Token …`` authentication; members of ``sluice-viewer`` or
``sluice-operator`` and superusers may read.  ``since`` defaults to 24 hours before the
newest window; at most :data:`MAX_WINDOWS` windows, oldest first.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.records.models import MetricWindow, PipelineRun
from core.records.run import last_run
from pipeline.job import parse_since

VIEWER_GROUP = "sluice-viewer"
OPERATOR_GROUP = "sluice-operator"
MAX_WINDOWS = 20_000
DEFAULT_SPAN = dt.timedelta(hours=24)
FIELDS = ("queue", "message_type", "window_start", "window_seconds", "messages", "throughput_per_s",
          "processing_ms_p50", "processing_ms_p95", "processing_ms_p99", "critical_ms_p99", "failure_rate",
          "retries", "expired", "dead_lettered")


def _groups(user) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


def can_view(user) -> bool:
    """Viewers and operators look; superusers are operators."""
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return False
    return user.is_superuser or bool(_groups(user) & {VIEWER_GROUP, OPERATOR_GROUP})


def can_operate(user) -> bool:
    if user is None or not user.is_authenticated:
        return False
    return user.is_superuser or OPERATOR_GROUP in _groups(user)


class IsSluiceViewer(BasePermission):
    """Members of sluice-viewer / sluice-operator and superusers (the dashboard's roles)."""

    message = f"Viewing metrics needs the {VIEWER_GROUP} or {OPERATOR_GROUP} role."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_view(request.user)


def run_json(run: PipelineRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    iso = lambda t: t.isoformat() if t else None  # noqa: E731
    return {"id": run.pk, "status": run.status, "stage": run.stage, "progress": run.progress,
            "trigger": run.trigger, "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
            "exported": run.exported, "windows": run.windows, "seconds": run.seconds,
            "spark_master": run.spark_master, "error": run.error}


def window_query(params) -> tuple[dict[str, Any], int, dt.datetime | None]:
    """Filters from query parameters (ValidationError with a message on bad input):
    returns (filters, window seconds, since or None)."""
    window_text = params.get("window", "60")
    if window_text not in ("60", "3600"):
        raise ValidationError({"window": f"window must be 60 or 3600, not {window_text!r}"})
    since = None
    if params.get("since"):
        try:
            since = parse_since(params["since"])
        except ValueError:
            raise ValidationError({"since": f"since must be an ISO 8601 instant, not {params['since']!r}"}) from None
    filters: dict[str, Any] = {"window_seconds": int(window_text)}
    for name in ("queue", "message_type"):
        if params.get(name):
            filters[name] = params[name]
    return filters, int(window_text), since


def windows_for(filters: dict[str, Any], since: dt.datetime | None, limit: int = MAX_WINDOWS) -> list[MetricWindow]:
    qs = MetricWindow.objects.filter(**filters)
    if since is None:
        newest = qs.order_by("-window_start").values_list("window_start", flat=True).first()
        since = newest - DEFAULT_SPAN if newest else None
    if since is not None:
        qs = qs.filter(window_start__gte=since)
    return list(qs.order_by("window_start", "queue", "message_type")[:limit])


class MetricsView(APIView):
    # Token first: an anonymous call gets 401 with "WWW-Authenticate: Token", not a bare 403.
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsSluiceViewer]

    def get(self, request: Request) -> Response:
        filters, _, since = window_query(request.query_params)
        rows = [{name: (getattr(w, name).isoformat() if name == "window_start" else getattr(w, name))
                 for name in FIELDS} for w in windows_for(filters, since)]
        return Response({"windows": rows, "last_run": run_json(last_run())})


metrics = MetricsView.as_view()
