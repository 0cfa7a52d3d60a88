"""The metrics page in a real browser (headless Chromium, Playwright) against the live server:
log in, open "Metrics" from the navigation, find the server-rendered SVG charts of the windows
the test loads into MetricWindow (no Spark needed), a viewer's disabled run button, and the run
panel polling (htmx) until a run is over, then the page reloading itself — with no request of
the page's own answered 4xx/5xx.  Setup: tests/browser_support.py."""
from __future__ import annotations

import datetime as dt

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core.models.records import MetricWindow, PipelineRun, RunStatus  # noqa: E402

pytestmark = BROWSER_MARKS

T0 = dt.datetime(2026, 11, 23, 9, 0, tzinfo=dt.timezone.utc)


def load_windows() -> None:
    MetricWindow.objects.bulk_create([
        MetricWindow(queue=queue, message_type="Msg", window_start=T0 + dt.timedelta(minutes=i), window_seconds=60,
                     messages=100 + 10 * i, throughput_per_s=(100 + 10 * i) / 60, processing_ms_p50=3.0 + i,
                     processing_ms_p95=9.0 + i, processing_ms_p99=15.0 + i, critical_ms_p99=40.0,
                     failure_rate=0.05 * (queue == "payments"), failures=5 * (queue == "payments"))
        for queue in ("orders", "payments") for i in range(6)])


def test_viewer_opens_metrics_and_sees_the_charts(live_server, page):
    load_windows()
    PipelineRun.objects.create(status=RunStatus.SUCCEEDED, stage="done", progress=100, exported=1200, windows=12,
                               seconds=4.2, spark_master="local[*]", started_at=T0, finished_at=T0)
    make_user("viewer", "vera")
    net = NetworkLog(page)
    login(page, live_server.url, "vera")
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Metrics").click()
    page.wait_for_url(f"{live_server.url}/metrics/charts/")
    expect(page.get_by_role("heading", name="Metrics", exact=True)).to_be_visible()
    for queue in ("orders", "payments"):
        charts = page.locator(f'section[data-queue="{queue}"] svg.chart')
        expect(charts).to_have_count(3)  # throughput, processing time, failure rate
        expect(charts.first).to_be_visible()
        # One point per loaded window on the throughput line.
        points = charts.first.locator("polyline").first.get_attribute("points").split()
        assert len(points) == 6
    expect(page.locator("#last-run")).to_contain_text("local[*]")
    button = page.get_by_role("button", name="Run the pipeline now")
    expect(button).to_be_disabled()
    assert "sluice-viewer" in button.get_attribute("title")
    assert page.evaluate("getComputedStyle(document.querySelector('svg.chart')).borderTopStyle") == "solid"  # sluice.css
    assert net.failures == []


def test_the_run_panel_polls_until_the_run_is_over(live_server, page):
    load_windows()
    run = PipelineRun.objects.create(status=RunStatus.RUNNING, stage="job", progress=40, started_at=T0)
    make_user("operator", "otto")
    net = NetworkLog(page)
    login(page, live_server.url, "otto", "/metrics/charts/")
    panel = page.locator("#last-run")
    expect(panel).to_have_attribute("data-running", "true")
    expect(panel.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "40")
    run.progress = 80
    run.save(update_fields=["progress"])
    expect(panel.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "80", timeout=10_000)  # a poll
    page.evaluate("window.__same_page = 1")
    run.status, run.progress, run.finished_at, run.windows = RunStatus.SUCCEEDED, 100, T0, 12
    run.save()
    # The poll that sees the run over reloads the page (new charts); its panel no longer polls.
    expect(panel).to_have_attribute("data-running", "false", timeout=10_000)
    expect(panel).to_contain_text("succeeded")
    assert page.evaluate("window.__same_page") is None  # a new page, not just a new panel
    expect(page.get_by_role("button", name="Run the pipeline now")).to_be_enabled()
    assert page.locator("svg.chart").count() == 6
    assert net.failures == []
