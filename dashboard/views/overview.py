"""``/``: every queue with its counts, throughput and oldest message, and worker and
circuit-breaker health; the numbers region re-renders through htmx polling.

The numbers come from dashboard.stats' snapshot, cached for a few seconds and shared by
every tab, so polling costs a bounded number of cheap statements."""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from dashboard import stats
from dashboard.permissions import viewer_required
from dashboard.views.common import page

#: Seconds between two refreshes of the numbers region.
POLL_SECONDS = 3


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


def _context() -> dict[str, Any]:
    snap = stats.snapshot()
    workers = _workers(snap.health)
    errors = {(w["name"], b.get("name")): b.get("last_error") or "" for w in workers for b in w.get("breakers", [])}
    triggered = [{**t, "last_error": errors.get((t["worker"], t["breaker"]), "")} for t in snap.health.triggered]
    readable = [q for q in snap.queues if not q.error]
    return {
        "snap": snap, "workers": workers, "triggered": triggered, "poll_seconds": POLL_SECONDS,
        "section": "overview", "total_pending": sum(q.pending or 0 for q in readable),
        "estimated": any(q.estimated for q in readable),
        "failed_unresolved": snap.failed.get("unresolved", 0),
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
