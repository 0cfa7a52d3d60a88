"""``GET /metrics``: Prometheus text, no login (scrapers have none; nothing here is a
message's content).  Built from the cached statistics snapshot (dashboard/counting/stats.py), so a
scrape costs what an overview refresh costs, at most once per few seconds."""
from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from core.conf import get_settings
from core.models.alerts import Alert, AlertState
from dashboard.counting import stats

FIRING_KEY = "sluice:alerts:firing"


def registry_for(snap: stats.Snapshot) -> CollectorRegistry:
    """A fresh registry holding the snapshot's values (nothing global: every scrape is the truth now)."""
    registry = CollectorRegistry(auto_describe=True)
    pending = Gauge("sluice_queue_pending", "Messages waiting in the queue (estimated for big queues).",
                    ["queue"], registry=registry)
    expired = Gauge("sluice_queue_expired", "Expired messages not yet purged (at least).", ["queue"],
                    registry=registry)
    delayed_due = Gauge("sluice_queue_delayed_due", "Delayed messages for the queue that are due.", ["queue"],
                        registry=registry)
    scheduled = Gauge("sluice_queue_scheduled", "Delayed messages for the queue not yet due.", ["queue"],
                      registry=registry)
    oldest = Gauge("sluice_queue_oldest_age_seconds", "Age of the oldest message in the queue.", ["queue"],
                   registry=registry)
    unreadable = Gauge("sluice_queue_unreadable", "1 when the queue's table could not be read.", ["queue"],
                       registry=registry)
    for q in snap.queues:
        unreadable.labels(q.name).set(1 if q.error else 0)
        if q.error:
            continue
        pending.labels(q.name).set(q.pending or 0)
        expired.labels(q.name).set(q.expired or 0)
        delayed_due.labels(q.name).set(q.delayed_due)
        scheduled.labels(q.name).set(q.scheduled)
        if q.oldest_age_seconds is not None:
            oldest.labels(q.name).set(q.oldest_age_seconds)
    failed = Gauge("sluice_failed_messages", "Failed-message records by status.", ["status"], registry=registry)
    for status, count in snap.failed.items():
        failed.labels(status).set(count)
    h = snap.health
    Gauge("sluice_redis_up", "1 when Redis (worker health) answers.", registry=registry).set(
        1 if h.redis == "up" else 0)
    Gauge("sluice_workers", "Workers with a live heartbeat.", registry=registry).set(len(h.workers))
    breaker = Gauge("sluice_breaker_triggered", "1 when the worker's circuit breaker is triggered.",
                    ["worker", "breaker"], registry=registry)
    processed = Counter("sluice_messages_processed", "Messages the worker's handlers processed since it started.",
                        ["worker"], registry=registry)
    for w in h.workers:
        name = str(w.get("name", "?"))
        for b in w.get("breakers", []):
            breaker.labels(name, str(b.get("name", "?"))).set(1 if b.get("state") == "triggered" else 0)
        processed.labels(name).inc(max(int(w.get("processed") or 0), 0))
    return registry


def add_alerts(registry: CollectorRegistry) -> None:
    """``sluice_alerts_firing{rule, severity, fingerprint, …}``: 1 per firing alert (one indexed
    read of the firing rows; the scope labels a rule may add are in ``scope``)."""
    firing = Gauge("sluice_alerts_firing", "1 for each firing Sluice alert.", ["rule", "severity", "scope", "fingerprint"],
                   registry=registry)
    rows = stats._cache_get(FIRING_KEY)  # shared like the snapshot: a scrape reads nothing most times
    if rows is None:
        try:
            rows = list(Alert.objects.filter(state=AlertState.FIRING).values_list("labels", "fingerprint")[:1000])
        except DatabaseError:
            return
        stats._cache_set(FIRING_KEY, rows, get_settings().DASHBOARD_CACHE_SECONDS)
    for labels, key in rows:
        scope = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity"))
        firing.labels(labels.get("alertname", "?"), labels.get("severity", ""), scope, key).set(1)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    registry = registry_for(stats.snapshot())
    add_alerts(registry)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
