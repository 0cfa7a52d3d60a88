"""``/metrics/charts/``: throughput, processing-time percentiles and failure rate per queue
over time (server-rendered SVG), the last pipeline run, and — for operators — a button
that runs the pipeline now as a Celery task, with its progress.

The run is started by task name through a producer-only Celery app on REDIS_URL: the
dashboard does not import the workers package (an import contract)."""
from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from rest_framework.exceptions import ValidationError

from core.records.models import PipelineRun, RunStatus
from core.records.run import last_run
from dashboard.metrics_api import can_operate, can_view, window_query, windows_for
from dashboard.svgchart import Series, line_chart

log = logging.getLogger("sluice.dashboard")
COLORS = {"throughput": "#2563eb", "p50": "#16a34a", "p95": "#d97706", "p99": "#dc2626", "failure": "#b91c1c"}
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


@login_required
def charts(request: HttpRequest) -> HttpResponse:
    if not can_view(request.user):
        raise PermissionDenied("Viewing metrics needs the sluice-viewer or sluice-operator role.")
    try:
        filters, window, since = window_query(request.GET)
    except ValidationError as exc:
        return HttpResponse(f"Bad request: {'; '.join(str(v[0]) for v in exc.detail.values())}",
                            status=400, content_type="text/plain")
    windows = windows_for(filters, since, limit=MAX_POINTS)
    run = last_run()
    in_progress = run is not None and run.status in (RunStatus.QUEUED, RunStatus.RUNNING)
    return render(request, "dashboard/charts.html", {
        "charts": queue_charts(windows), "window": window, "run": run, "in_progress": in_progress,
        "operator": can_operate(request.user), "queue": filters.get("queue", ""),
        "first": windows[0].window_start if windows else None,
        "last": windows[-1].window_start if windows else None,
    })


def _celery():
    from celery import Celery

    return Celery("sluice-dashboard", broker=settings.REDIS_URL)


@login_required
@require_POST
def run_now(request: HttpRequest) -> HttpResponse:
    """Queue a pipeline run as a Celery task; its row shows the progress on the charts page."""
    if not can_operate(request.user):
        raise PermissionDenied("Running the pipeline needs the sluice-operator role.")
    run = PipelineRun.objects.create(status=RunStatus.QUEUED, trigger=f"dashboard:{request.user.get_username()}")
    try:
        _celery().send_task("sluice.run_pipeline", kwargs={"run_id": run.pk, "trigger": run.trigger},
                            queue="sluice", retry=False)
    except Exception as exc:  # the broker is down: say so, keep no phantom run
        log.warning("cannot queue the pipeline run: %s", exc)
        run.status, run.error = RunStatus.FAILED, f"could not queue the task: {exc}"
        run.save(update_fields=["status", "error"])
        messages.error(request, "The pipeline could not be started: the task queue (Redis) is unreachable.")
        return redirect("dashboard:metrics-charts")
    messages.success(request, f"Pipeline run {run.pk} queued.")
    return redirect("dashboard:metrics-charts")
