"""``/monitoring/``: every queue's throughput, retries, processing and critical time and
length over a period (1 m, 5 m, 15 m, 1 h or a from–to range) as sparklines with the
period's averages, its failed count linking to its failed groups, and the workers' stale and
clock-skew flags; ``/monitoring/<queue>/``: one queue's charts, by message type and by worker.

The figures region refreshes itself (htmx polling, no inline script: the page's CSP) once a
bucket while the period ends now; a past range does not refresh.  The data:
dashboard/monitoring.py (shared with the JSON API)."""
from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote, urlencode

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET

from core.monitoring.live import PERIODS, Bucket, Period, QueueSeries
from dashboard import monitoring as data
from dashboard.actions import ActionError
from dashboard.security.permissions import viewer_required
from dashboard.charts.sparklines import Scale, spark_svg
from dashboard.charts.svgchart import Series, line_chart
from dashboard.views.common import error_response, page
from dashboard.pages import is_htmx

#: CSS variables (sluice.css): the charts take each theme's colours.
COLORS = {"throughput": "var(--chart-blue)", "retries": "var(--chart-amber)", "failures": "var(--chart-red)",
          "processing": "var(--chart-green)", "critical": "var(--chart-violet)", "length": "var(--chart-cyan)",
          "p50": "var(--chart-green)", "p95": "var(--chart-amber)", "p99": "var(--chart-red)"}


def ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.2f} ms"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}/s"


def _points(p: Period, buckets: list[Bucket], figure) -> list[tuple[dt.datetime, float | None]]:
    """A figure per bucket, drawn at the bucket's middle (the last bucket only up to now)."""
    half = dt.timedelta(seconds=p.bucket_seconds / 2)
    return [(b.start + half, figure(b)) for b in buckets if b.start.timestamp() * 1e6 <= p.now_us]


def _markers(markers) -> list[tuple[dt.datetime, str]]:
    return [(m.at, m.label) for m in markers]


class _Layout:
    """What every sparkline of a page shares: the x of each visible bucket's middle and of
    each deploy marker (worked out once, not 5 × 50 times)."""

    def __init__(self, p: Period, markers) -> None:
        scale = Scale((p.start, p.end))
        half = dt.timedelta(seconds=p.bucket_seconds / 2)
        starts = [start for start in p.bucket_starts() if start.timestamp() * 1e6 <= p.now_us]
        self.xs = [scale.x(start + half) for start in starts]
        self.markers = scale.markers(_markers(markers))


def _sparks(layout: _Layout, s: QueueSeries) -> list[dict[str, Any]]:
    figures = [
        ("throughput", "Throughput", rate(s.throughput_per_s), lambda b: b.throughput_per_s),
        ("retries", "Retries", f"{s.retried}", lambda b: b.retried if b.records or b.from_windows else None),
        ("processing", "Processing time", ms(s.processing_avg_ms), lambda b: b.processing_avg_ms),
        ("critical", "Critical time", ms(s.critical_avg_ms), lambda b: b.critical_avg_ms),
        ("length", "Queue length", "—" if s.length_last is None else
         f"{'≈ ' if s.length_estimated else ''}{s.length_last}", lambda b: b.length),
    ]
    visible = s.buckets[:len(layout.xs)]
    return [{"name": name, "label": label, "value": value,
             "svg": spark_svg(f"{s.queue}: {label.lower()}", layout.xs, [figure(b) for b in visible],
                              layout.markers, COLORS[name])}
            for name, label, value, figure in figures]


def _links(request: HttpRequest, p: Period) -> dict[str, Any]:
    """The period switcher's links (keeping the queue filter) and the range form's values."""
    keep = {"q": request.GET["q"]} if request.GET.get("q") else {}
    return {
        "periods": [{"name": name, "href": "?" + urlencode({**keep, "period": name}), "current": p.name == name}
                    for name in PERIODS],
        "range_from": p.start.strftime("%Y-%m-%dT%H:%M"),
        "range_to": p.end.strftime("%Y-%m-%dT%H:%M"), "query_string": request.GET.urlencode(),
    }


@viewer_required
@require_GET
def monitoring(request: HttpRequest) -> HttpResponse:
    try:
        o = data.overview(request.GET)
    except ActionError as exc:
        return error_response(request, exc.message, exc.status)
    failed_url = reverse("dashboard:failed") + "?queue={}"
    queue_url = reverse("dashboard:monitoring-queue", args=["QUEUE"]).replace("QUEUE", "{}")
    suffix = "?" + request.GET.urlencode() if request.GET else ""
    layout = _Layout(o.period, o.markers)
    rows = [{"name": s.queue, "kind": o.kinds.get(s.queue, ""), "href": queue_url.format(quote(s.queue)) + suffix,
             "failed": o.failed.get(s.queue, 0), "failed_href": failed_url.format(quote(s.queue)),
             "sparks": _sparks(layout, s), "records": s.records, "skewed": s.skewed}
            for s in o.series]
    template = "dashboard/partials/monitoring_body.html" if is_htmx(request) else "dashboard/monitoring.html"
    return page(request, template, {"section": "monitoring", "o": o, "p": o.period, "rows": rows,
                                    "workers": o.workers, **_links(request, o.period)})


@viewer_required
@require_GET
def monitoring_queue(request: HttpRequest, name: str) -> HttpResponse:
    try:
        d = data.queue_detail(name, request.GET)
    except ActionError as exc:
        return error_response(request, exc.message, exc.status)
    p, s, marks = d.period, d.series, _markers(d.markers)
    span = (p.start, p.end)

    def chart(title: str, series: list[Series], fmt=lambda v: f"{v:.3g}") -> Any:
        return line_chart(f"{s.queue}: {title}", series, fmt, span=span, markers=marks)

    def pct(kind: str) -> list[Series]:
        """The average (every record) and p50/p95/p99 (the newest records, or the windows')."""
        return [Series("average", COLORS["length"], _points(p, s.buckets, lambda b: getattr(b, f"{kind}_avg_ms"))),
                *[Series(f"p{q}", COLORS[f"p{q}"], _points(p, s.buckets, lambda b, q=q: getattr(b, f"{kind}_ms").get(q)))
                  for q in (50, 95, 99)]]

    charts = [
        chart("throughput and retries (per second)", [
            Series("handled/s", COLORS["throughput"], _points(p, s.buckets, lambda b: b.throughput_per_s)),
            Series("retries/s", COLORS["retries"], _points(p, s.buckets, lambda b: b.retried / p.bucket_seconds
                                                            if b.records or b.from_windows else None))]),
        chart("processing time (ms)", pct("processing")),
        chart("critical time (ms)", pct("critical")),
        chart("queue length", [Series("messages", COLORS["length"], _points(p, s.buckets, lambda b: b.length))],
              lambda v: f"{v:g}"),
    ]
    handled_by = {x.key for x in d.by_worker}
    workers = [w for w in (d.workers.workers if d.workers else []) if w.name in handled_by or w.stale or w.clock_skew]
    template = "dashboard/partials/monitoring_queue_body.html" if is_htmx(request) else "dashboard/monitoring_queue.html"
    return page(request, template, {
        "section": "monitoring", "d": d, "p": p, "s": s, "charts": charts, "worker_flags": workers,
        "failed_href": reverse("dashboard:failed") + "?queue=" + quote(s.queue),
        "processing": {q: ms(v) for q, v in s.processing_ms.items()},
        "critical": {q: ms(v) for q, v in s.critical_ms.items()}, "throughput": rate(s.throughput_per_s),
        "processing_avg": ms(s.processing_avg_ms), "critical_avg": ms(s.critical_avg_ms),
        "by_type": [_slice_row(x) for x in d.by_type], "by_worker": [_slice_row(x) for x in d.by_worker],
        "back": reverse("dashboard:monitoring") + ("?" + request.GET.urlencode() if request.GET else ""),
        **_links(request, p),
    })


def _slice_row(x) -> dict[str, Any]:
    return {"key": x.key or "(none)", "records": x.records, "retried": x.retried, "failures": x.failures,
            "throughput": rate(x.throughput_per_s), "skewed": x.skewed,
            "processing": {q: ms(v) for q, v in x.processing_ms.items()},
            "critical": {q: ms(v) for q, v in x.critical_ms.items()}}
