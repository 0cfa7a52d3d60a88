"""The analytics pipeline's metric windows as the charts page and ``GET /api/metrics/``
read them: query parameters → filters, the windows, the last run as JSON.

    ?queue=&message_type=&window=60|3600&since=ISO&before=ISO

``since`` defaults to 24 hours before the newest window.  A page is the *newest* windows
that fit (at most :data:`MAX_WINDOWS`; the charts page shows fewer), listed oldest first;
``before`` (the previous page's ``next_before``) pages back to older ones.  A page never
splits the windows of one start time, so paging misses none and repeats none.  Bad
parameters raise ActionError (400 with the reason)."""
from __future__ import annotations

import datetime as dt
from typing import Any, Mapping

from core.models.records import MetricWindow, PipelineRun
from pipeline.job import parse_since

from dashboard.actions import ActionError

MAX_WINDOWS = 20_000
DEFAULT_SPAN = dt.timedelta(hours=24)
#: The API's window fields, in the order it prints them (README: "JSON API").
FIELDS = ("queue", "message_type", "window_start", "window_seconds", "messages", "throughput_per_s",
          "processing_ms_p50", "processing_ms_p95", "processing_ms_p99", "critical_ms_p99", "failure_rate",
          "retries", "expired", "dead_lettered")


def run_json(run: PipelineRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    iso = lambda t: t.isoformat() if t else None  # noqa: E731
    return {"id": run.pk, "status": run.status, "stage": run.stage, "progress": run.progress,
            "trigger": run.trigger, "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
            "exported": run.exported, "windows": run.windows, "seconds": run.seconds,
            "spark_master": run.spark_master, "error": run.error}


def since_param(raw: str | None, name: str = "since") -> dt.datetime | None:
    """An ISO 8601 query parameter (``since``, ``before``), or None when absent."""
    if not raw:
        return None
    try:
        return parse_since(raw)
    except ValueError:
        raise ActionError(f"{name} must be an ISO 8601 instant, not {raw[:40]!r}") from None


def before_param(params: Mapping[str, str]) -> dt.datetime | None:
    return since_param(params.get("before"), "before")


def window_query(params: Mapping[str, str]) -> tuple[dict[str, Any], int, dt.datetime | None]:
    """(filters, window seconds, since or None) from query parameters."""
    window_text = params.get("window", "60")
    if window_text not in ("60", "3600"):
        raise ActionError(f"window must be 60 or 3600, not {window_text[:20]!r}")
    filters: dict[str, Any] = {"window_seconds": int(window_text)}
    for name in ("queue", "message_type"):
        if params.get(name):
            filters[name] = params[name]
    return filters, int(window_text), since_param(params.get("since"))


def windows_for(filters: dict[str, Any], since: dt.datetime | None, limit: int = MAX_WINDOWS) -> list[MetricWindow]:
    """The newest page (see the module docstring), oldest first."""
    return window_page(filters, since, None, limit)[0]


def window_page(filters: dict[str, Any], since: dt.datetime | None, before: dt.datetime | None,
                limit: int = MAX_WINDOWS) -> tuple[list[MetricWindow], dt.datetime | None]:
    """(the newest ``limit`` windows from ``since`` and before ``before``, oldest first;
    the ``before`` of the next, older page, or None when there is none)."""
    qs = MetricWindow.objects.filter(**filters)
    if since is None:
        newest = qs.order_by("-window_start").values_list("window_start", flat=True).first()
        since = newest - DEFAULT_SPAN if newest else None
    if since is not None:
        qs = qs.filter(window_start__gte=since)
    if before is not None:
        qs = qs.filter(window_start__lt=before)
    newest_first = list(qs.order_by("-window_start", "-queue", "-message_type")[:limit + 1])
    if len(newest_first) <= limit:
        return newest_first[::-1], None
    page = newest_first[:limit]
    oldest = page[-1].window_start
    if newest_first[limit].window_start == oldest and page[0].window_start != oldest:
        # The next window shares the page's oldest start: leave that start whole to the next page.
        page = [w for w in page if w.window_start != oldest]
    return page[::-1], page[-1].window_start


def window_json(w: MetricWindow) -> dict[str, Any]:
    return {name: (w.window_start.isoformat() if name == "window_start" else getattr(w, name)) for name in FIELDS}
