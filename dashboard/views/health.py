"""``GET /healthz``: open to anyone (load balancers, probes), no login; the details only
to a logged-in user with a Sluice role."""
from __future__ import annotations

import logging

from core.conf import get_settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse

from core.runtime.health import read_health
from dashboard.security.permissions import can_view

log = logging.getLogger("sluice.dashboard")


def healthz(request: HttpRequest) -> JsonResponse:
    """Database, Redis and workers (heartbeats with loop and breaker states).

    200 while the database answers — Redis down only degrades (messages flow without
    it) — and 503 when the database does not.  Anonymous callers get ``{"status": …}``
    only: the details name worker hosts and breakers, and a breaker's last error can quote
    row values from a database error."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "up"
    except DatabaseError as exc:
        log.warning("healthz: database down: %s", exc)
        database = "down"
    health = read_health(get_settings().REDIS_URL)
    triggered = [b["name"] for w in health["workers"] for b in w["breakers"] if b["state"] == "triggered"]
    ok = database == "up" and health["redis"] == "up" and not triggered
    body = {"status": "ok" if ok else ("down" if database == "down" else "degraded"),
            "database": database, "triggered_breakers": triggered, **health}
    if not can_view(request.user):
        body = {"status": body["status"]}
    return JsonResponse(body, status=200 if database == "up" else 503)
