"""``/``: every queue with its counts, throughput and oldest message, and worker and
circuit-breaker health; the numbers region re-renders through htmx polling.

The numbers come from dashboard.counting.stats' snapshot, cached for a few seconds and shared by
every tab, so polling costs a bounded number of cheap statements."""
from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from core.runtime import pauses
from dashboard.counting import stats
from dashboard.security.permissions import viewer_required
from dashboard.templatetags.sluice_ui import age
from dashboard.views.common import page

#: Seconds between two refreshes of the numbers region.
POLL_SECONDS = 3
#: Status colour of a queue's kind (error queues red, dead-letter amber).
KIND_CLASSES = {"error": "bad", "dead_letter": "warn"}


def _workers(health: stats.Health) -> list[dict[str, Any]]:
    """Heartbeats with their time as a datetime, and each breaker's last error."""
    workers = []
    for worker in health.workers:
        worker = dict(worker)
        try:
            worker["last_seen_at"] = dt.datetime.fromisoformat(worker.get("last_seen") or "")
        except ValueError:
            worker["last_seen_at"] = None
        workers.append(worker)
    return workers


def _number(value: int | None, prefix: str = "", suffix: str = "") -> str:
    return "—" if value is None else f"{prefix}{value}{suffix}"


def _rows(snap: stats.Snapshot, paused: dict[str, pauses.PauseInfo]) -> list[dict[str, Any]]:
    """The queue table's rows as display strings: the template only loops (a page may list
    hundreds of queues, and per-cell template logic costs about a millisecond a row)."""
    queue_url = reverse("dashboard:queue", args=["QUEUE"]).replace("QUEUE", "{}")
    pause_url = reverse("dashboard:queue-pause", args=["QUEUE"]).replace("QUEUE", "{}")
    resume_url = reverse("dashboard:queue-resume", args=["QUEUE"]).replace("QUEUE", "{}")
    failed_url = reverse("dashboard:failed") + "?queue={}"
    rows = []
    for q in snap.queues:
        cells: list[tuple[str, str, str]] = []
        if not q.error:
            def count(name: str, value: int | None, text: str, alert: bool = False, href: str = "") -> None:
                cls = "alert" if alert and value else ("zero" if not value else "")
                cells.append((f"num {name} {cls}", text, href if value else ""))

            count("pending", q.pending, _number(q.pending, "≈ " if q.estimated else ""))
            count("delayed-due", q.delayed_due, _number(q.delayed_due))
            count("scheduled", q.scheduled, _number(q.scheduled))
            count("expired", q.expired, _number(q.expired, suffix="+" if q.expired_capped else ""))
            count("errors", q.errors, _number(q.errors), alert=True, href=failed_url.format(quote(q.name)))
        cells.append(("num", "—" if q.sent_per_minute is None else f"{q.sent_per_minute:.0f}", ""))
        cells.append(("num", age(q.oldest_age_seconds), ""))
        rows.append({"name": q.name, "url": queue_url.format(quote(q.name)), "kind": q.kind, "error": q.error,
                     "kind_class": KIND_CLASSES.get(q.kind, "idle"), "cells": cells, "paused": paused.get(q.name),
                     "toggle": "resume" if q.name in paused else "pause",
                     "toggle_url": (resume_url if q.name in paused else pause_url).format(quote(q.name))})
    return rows


def _context() -> dict[str, Any]:
    snap = stats.snapshot()
    # Read each time, not from the cached snapshot: a pause shows at once (a tiny table).
    paused = pauses.paused_queues()
    workers = _workers(snap.health)
    errors = {(w["name"], b.get("name")): b.get("last_error") or "" for w in workers for b in w.get("breakers", [])}
    triggered = [{**t, "last_error": errors.get((t["worker"], t["breaker"]), "")} for t in snap.health.triggered]
    readable = [q for q in snap.queues if not q.error]
    return {
        "snap": snap, "rows": _rows(snap, paused), "paused_count": len(paused),
        "overview_url": reverse("dashboard:overview"), "workers": workers, "triggered": triggered, "poll_seconds": POLL_SECONDS,
        "section": "overview", "total_pending": sum(q.pending or 0 for q in readable),
        "estimated": any(q.estimated for q in readable),
        "failed_unresolved": snap.failed.get("unresolved", 0),
        "failed_unresolved_text": _number(snap.failed.get("unresolved", 0)),
    }


@viewer_required
@require_GET
def overview(request: HttpRequest) -> HttpResponse:
    return page(request, "dashboard/overview.html", _context())


@viewer_required
@require_GET
def overview_numbers(request: HttpRequest) -> HttpResponse:
    """The polled fragment: tiles, health and the queue table."""
    return page(request, "dashboard/partials/overview_numbers.html", _context())
