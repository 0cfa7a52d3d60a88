"""The live monitoring tab's data, as the pages (dashboard/views/monitoring.py) and the JSON
API (dashboard/api/monitoring.py) both read it: query parameters → a period, then every
queue's figures (core.monitoring.live), the failed count of each queue (the statistics snapshot
every tab shares), the workers' flags and the period's deploy markers.

    ?period=1m|5m|15m|1h|range&from=ISO&to=ISO&q=TEXT      (one queue: &by is implied)

Bad parameters raise ActionError (400 with the reason)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping


from core.monitoring import live as monitoring
from core.conf import get_settings
from core.monitoring.live import Period, QueueSeries
from core.monitoring.slices import Slice, breakdowns
from core.monitoring.workers import Workers, worker_states
from dashboard import deploys
from dashboard.counting import stats
from dashboard.actions import ActionError
from dashboard.actions import validate
from dashboard.models import DeployMarker

DEFAULT_PERIOD = "5m"
#: Queues the overview shows at most (a filter narrows them).
MAX_QUEUES = 50
EARLIEST = dt.datetime(1971, 1, 1, tzinfo=dt.timezone.utc)


def parse_time(raw: str | None, name: str) -> dt.datetime | None:
    """An ISO 8601 time (a form's ``datetime-local`` value has no offset: UTC, as every
    time on the dashboard); times before 1971 read as 1971 (a range keeps its last 31 days)."""
    if not raw:
        return None
    try:
        value = dt.datetime.fromisoformat(raw.strip().upper().replace("Z", "+00:00"))
    except ValueError:
        raise ActionError(f"{name} must be an ISO 8601 time such as 2026-01-31T14:00, not {raw[:40]!r}") from None
    value = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    try:
        return max(value.astimezone(dt.timezone.utc), EARLIEST)
    except OverflowError:  # 0001-01-01 with a positive offset
        return EARLIEST


def period_from(params: Mapping[str, str]) -> Period:
    name = params.get("period") or DEFAULT_PERIOD
    start, end = parse_time(params.get("from"), "from"), parse_time(params.get("to"), "to")
    if name == DEFAULT_PERIOD and start is not None and "period" not in params:
        name = "range"  # a from without a period: the range it names
    try:
        return monitoring.make_period(name, start, end)
    except ValueError as exc:
        raise ActionError(str(exc)) from None


@dataclass
class Overview:
    period: Period
    series: list[QueueSeries]
    #: Unresolved failed messages per queue (the shared statistics snapshot).
    failed: dict[str, int]
    kinds: dict[str, str]
    workers: Workers
    markers: list[DeployMarker]
    #: Queues left out (beyond :data:`MAX_QUEUES`, or not matching the filter).
    hidden: int = 0
    query: str = ""


@dataclass
class QueueDetail:
    period: Period
    series: QueueSeries
    failed: int
    by_type: list[Slice] = field(default_factory=list)
    by_worker: list[Slice] = field(default_factory=list)
    markers: list[DeployMarker] = field(default_factory=list)
    workers: Workers | None = None


def _snapshot(period: Period) -> stats.Snapshot:
    """The statistics snapshot every tab shares (queues, failed counts), as fresh as the
    period's points: a 5-minute page refreshed every 10 s does not recompute it every 3 s."""
    fresh = max(get_settings().DASHBOARD_CACHE_SECONDS, min(period.refresh_seconds or stats.STALE_LIMIT,
                                                            stats.STALE_LIMIT))
    return stats.snapshot(max_age=fresh)


def overview(params: Mapping[str, str]) -> Overview:
    period = period_from(params)
    snap = _snapshot(period)
    query = (params.get("q") or "").strip()[:64]
    matching = [q for q in snap.queues if query.lower() in q.name.lower()]
    shown = matching[:MAX_QUEUES]
    series = monitoring.queue_series([q.name for q in shown], period)
    return Overview(period, [series[q.name] for q in shown], {q.name: q.errors for q in shown},
                    {q.name: q.kind for q in shown}, worker_states(get_settings().REDIS_URL, period.now_us),
                    deploys.markers_between(period.start, period.end), len(snap.queues) - len(shown), query)


def queue_detail(name: str, params: Mapping[str, str]) -> QueueDetail:
    info = validate.queue(name)
    period = period_from(params)
    series = monitoring.queue_series([info.name], period, monitoring.DETAIL_SAMPLE)[info.name]
    q = _snapshot(period).queue(info.name)
    slices = breakdowns(info.name, period, series.newest)
    return QueueDetail(period, series, q.errors if q else 0, slices["message_type"], slices["worker"],
                       deploys.markers_between(period.start, period.end),
                       worker_states(get_settings().REDIS_URL, period.now_us))


# -- JSON ------------------------------------------------------------------------------------------

def period_json(p: Period) -> dict[str, Any]:
    return {"name": p.name, "start": p.start.isoformat(), "end": p.end.isoformat(),
            "bucket_seconds": p.bucket_seconds, "live": p.live, "refresh_seconds": p.refresh_seconds, "note": p.note,
            "now": monitoring.when(p.now_us).isoformat()}


def workers_json(w: Workers) -> dict[str, Any]:
    return {"redis": w.redis, "error": w.error, "workers": [
        {"name": s.name, "last_seen": s.last_seen.isoformat() if s.last_seen else None, "age_seconds": s.age_seconds,
         "stale": s.stale, "clock_skew": s.clock_skew, "dead_loops": list(s.dead_loops)} for s in w.workers]}


def slice_json(s: Slice) -> dict[str, Any]:
    return {"key": s.key, "records": s.records, "retried": s.retried, "failures": s.failures,
            "throughput_per_s": s.throughput_per_s, "skewed": s.skewed,
            "processing_ms": {f"p{p}": s.processing_ms.get(p) for p in (50, 95, 99)},
            "critical_ms": {f"p{p}": s.critical_ms.get(p) for p in (50, 95, 99)}}


def overview_json(o: Overview) -> dict[str, Any]:
    return {"period": period_json(o.period), "hidden": o.hidden,
            "queues": [{**monitoring.series_json(s), "kind": o.kinds.get(s.queue, ""),
                        "failed_unresolved": o.failed.get(s.queue, 0)} for s in o.series],
            "workers": workers_json(o.workers), "deploys": [deploys.marker_json(m) for m in o.markers]}


def queue_json(d: QueueDetail) -> dict[str, Any]:
    return {"period": period_json(d.period), "queue": {**monitoring.series_json(d.series), "failed_unresolved": d.failed},
            "message_types": [slice_json(s) for s in d.by_type], "workers": [slice_json(s) for s in d.by_worker],
            "deploys": [deploys.marker_json(m) for m in d.markers]}
