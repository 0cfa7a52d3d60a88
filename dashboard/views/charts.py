"""``/metrics/charts/``: throughput, processing-time percentiles and failure rate per queue
over time (server-rendered SVG, dashboard/charts/svgchart.py), the last pipeline run, and — for
operators — "Run the pipeline now" (dashboard.actions.run_pipeline: a Celery task, audited).
While a run is queued or running the run panel polls itself (htmx), like the failed page's
bulk operations."""
from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.models.records import PipelineRun, RunStatus
from core.records.extra import INSTALL, missing
from core.records.run import last_run
from dashboard import actions
from dashboard.actions import ActionError
from dashboard.charts.metric_windows import window_query, windows_for
from dashboard.security.permissions import viewer_required
from dashboard.charts.svgchart import Series, line_chart
from dashboard.views.common import act, error_response, operator_only, page
from dashboard.pages import is_htmx

#: CSS variables (sluice.css): the charts take each theme's colours.
COLORS = {"throughput": "var(--chart-blue)", "p50": "var(--chart-green)", "p95": "var(--chart-amber)",
          "p99": "var(--chart-red)", "failure": "var(--chart-crimson)"}
#: Most windows drawn on one page (every queue together).
MAX_POINTS = 5000


def _per_queue(windows) -> dict[str, dict[dt.datetime, list]]:
    """queue → window start → its windows (one per message type)."""
    by_queue: dict[str, dict[dt.datetime, list]] = defaultdict(lambda: defaultdict(list))
    for w in windows:
        by_queue[w.queue][w.window_start].append(w)
    return by_queue


def _weighted(ws, name: str) -> float | None:
    """A queue-level figure from its message types' windows: weighted by messages (an
    approximation for percentiles; the API has every type's exact figures)."""
    pairs = [(getattr(w, name), w.messages) for w in ws if getattr(w, name) is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def queue_charts(windows) -> list[dict]:
    charts = []
    for queue, by_start in sorted(_per_queue(windows).items()):
        starts = sorted(by_start)
        throughput = [(t, sum(w.throughput_per_s for w in by_start[t])) for t in starts]
        failure = [(t, sum(w.failure_rate * w.messages for w in by_start[t]) /
                    max(1, sum(w.messages for w in by_start[t])) * 100) for t in starts]
        latency = [Series(f"p{p}", COLORS[f"p{p}"], [(t, _weighted(by_start[t], f"processing_ms_p{p}"))
                                                        for t in starts]) for p in (50, 95, 99)]
        charts.append({
            "queue": queue,
            "messages": sum(w.messages for ws in by_start.values() for w in ws),
            "throughput": line_chart(f"{queue}: throughput (messages/s)",
                                     [Series("messages/s", COLORS["throughput"], throughput)], "{:.3g}".format),
            "latency": line_chart(f"{queue}: processing time (ms)", latency, "{:.3g}".format),
            "failures": line_chart(f"{queue}: failure rate (%)",
                                   [Series("failure %", COLORS["failure"], failure)], "{:.0f}%".format),
        })
    return charts


def pipeline_missing() -> str:
    """Why this installation cannot run the pipeline ("" when it can)."""
    absent = missing("pyspark", "pyarrow")
    return f"{' and '.join(absent)} not installed: {INSTALL}" if absent else ""


def _run_context() -> dict:
    run: PipelineRun | None = last_run()
    return {"run": run, "in_progress": run is not None and run.status in (RunStatus.QUEUED, RunStatus.RUNNING)}


@viewer_required
@require_GET
def charts(request: HttpRequest) -> HttpResponse:
    try:
        filters, window, since = window_query(request.GET)
    except ActionError as exc:
        return error_response(request, exc.message, exc.status)
    windows = windows_for(filters, since, limit=MAX_POINTS)
    return page(request, "dashboard/charts.html", {
        "section": "metrics", "charts": queue_charts(windows), "window": window, "queue": filters.get("queue", ""),
        "first": windows[0].window_start if windows else None,
        "last": windows[-1].window_start if windows else None, **_run_context(),
        # Without the pipeline extra the page still shows what was loaded, and says what is missing.
        "pipeline_missing": pipeline_missing(),
    })


@viewer_required
@require_GET
def run_status(request: HttpRequest) -> HttpResponse:
    """The run panel, polled every 2 s while a run is queued or running.  Once it is over the
    panel has no trigger (the polling stops) and htmx reloads the page for the new charts."""
    context = _run_context()
    response = page(request, "dashboard/partials/pipeline_run.html", context)
    if is_htmx(request) and not context["in_progress"]:
        response["HX-Refresh"] = "true"
    return response


@operator_only("run_pipeline")
@require_POST
def run_now(request: HttpRequest) -> HttpResponse:
    return act(request, lambda: actions.run_pipeline(request.user, via="web"), reverse("dashboard:metrics-charts"))
