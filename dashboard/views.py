"""The overview page: every queue with its counts (the full dashboard comes later)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from core.queues import list_queues
from core.transport import Transport

log = logging.getLogger("sluice.dashboard")


@dataclass
class QueueRow:
    name: str
    kind: str
    pending: int | None
    expired: int | None
    ttl_seconds: float | None
    error: str = ""


def queue_rows() -> tuple[list[QueueRow], str]:
    """Counts for every registered queue; a queue whose table is unreadable shows its error."""
    try:
        records = list_queues()
    except DatabaseError as exc:
        log.warning("cannot read the queue registry: %s", exc)
        return [], "The queue registry cannot be read. Has `python manage.py sluice setup` run?"
    transport = Transport()
    rows = []
    for record in records:
        try:
            counts = transport.counts(record.name)
            rows.append(QueueRow(record.name, record.kind, counts.pending, counts.expired, record.default_ttl_seconds))
        except DatabaseError as exc:
            log.warning("cannot count queue %s: %s", record.name, exc)
            rows.append(QueueRow(record.name, record.kind, None, None, record.default_ttl_seconds,
                                 error="table unreadable"))
    return rows, ""


def healthz(request: HttpRequest) -> JsonResponse:
    """Database, Redis and workers (heartbeats with loop and breaker states).

    200 while the database answers — Redis down only degrades (messages flow without
    it) — and 503 when the database does not."""
    from django.conf import settings
    from django.db import connection

    from core.health import read_health

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "up"
    except DatabaseError as exc:
        log.warning("healthz: database down: %s", exc)
        database = "down"
    health = read_health(settings.REDIS_URL)
    triggered = [b["name"] for w in health["workers"] for b in w["breakers"] if b["state"] == "triggered"]
    ok = database == "up" and health["redis"] == "up" and not triggered
    body = {"status": "ok" if ok else ("down" if database == "down" else "degraded"),
            "database": database, "triggered_breakers": triggered, **health}
    return JsonResponse(body, status=200 if database == "up" else 503)


def overview(request: HttpRequest) -> HttpResponse:
    rows, problem = queue_rows()
    return render(request, "dashboard/overview.html", {"rows": rows, "problem": problem})


def queue_table(request: HttpRequest) -> HttpResponse:
    rows, problem = queue_rows()
    return render(request, "dashboard/_queue_table.html", {"rows": rows, "problem": problem})
