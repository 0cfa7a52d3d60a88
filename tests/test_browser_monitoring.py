"""The monitoring tab in a real browser (headless Chromium, Playwright) against the live
server: open it from the navigation, switch the period (links and the from–to form), see the
region refresh itself (htmx, no inline script: the CSP holds), drill down into a queue (by
message type and worker, deploy markers on every chart) and follow its failed badge — with no
request of the page's own answered 4xx/5xx.  The screenshots of docs/operations/monitoring.md
are taken here (written to docs/screenshots/ with SLUICE_SCREENSHOTS=1)."""
from __future__ import annotations

import datetime as dt
import io
import os

from django.core.management import call_command

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.conftest import ROOT
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.monitoring_support import busy_queue  # noqa: F401 — a fixture

from playwright.sync_api import expect  # noqa: E402

pytestmark = BROWSER_MARKS


def test_viewer_switches_periods_and_drills_down(live_server, page, busy_queue, tmp_path):
    call_command("sluice", "mark-deploy", "v2.4.1", stdout=io.StringIO())
    make_user("viewer", "vera")
    net = NetworkLog(page)
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    login(page, live_server.url, "vera")
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Monitoring").click()
    page.wait_for_url(f"{live_server.url}/monitoring/")
    row = page.locator(f'tr[data-queue="{busy_queue}"]')
    expect(row.locator("svg.spark")).to_have_count(5)
    expect(row.locator("svg.spark line.deploy")).to_have_count(5)  # the deploy on every sparkline
    expect(row.locator('[data-role="failed-badge"]')).to_have_text("1 failed")
    shots = ROOT / "docs" / "screenshots" if os.environ.get("SLUICE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "monitoring.png"), full_page=True)

    # Periods: a link each; the shortest refreshes every 5 s by itself.
    page.locator('nav.periods a[data-period="1h"]').click()
    page.wait_for_url("**/monitoring/?period=1h")
    expect(page.locator("#monitoring")).to_have_attribute("hx-trigger", "every 120s")
    page.locator('nav.periods a[data-period="1m"]').click()
    page.wait_for_url("**/monitoring/?period=1m")
    with page.expect_response(lambda r: "/monitoring/?period=1m" in r.url and r.request.headers.get("hx-request"),
                              timeout=9000) as polled:
        pass
    assert polled.value.status == 200
    expect(row.locator("svg.spark")).to_have_count(5)  # the region re-rendered in place

    # A from–to range in the past: filled in the form, it does not refresh.
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M")
    end = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    page.get_by_label("From").fill(start)
    page.get_by_label("to", exact=True).fill(end)
    page.get_by_role("button", name="Show range").click()
    page.wait_for_url("**/monitoring/?period=range*")
    expect(page.locator("#monitoring")).not_to_have_attribute("hx-trigger", "every 5s")
    assert page.locator("#monitoring").get_attribute("hx-trigger") is None
    expect(page.locator('[data-role="period"]')).to_contain_text("240 s per point")

    # Drill down (the hour), by message type and by worker; the failed badge leads to the groups.
    page.locator('nav.periods a[data-period="1h"]').click()
    page.locator(f'tr[data-queue="{busy_queue}"] a[data-role="drill-down"]').click()
    page.wait_for_url(f"**/monitoring/{busy_queue}/?period=1h")
    expect(page.get_by_role("heading", name=busy_queue)).to_be_visible()
    expect(page.locator("svg.chart")).to_have_count(4)
    expect(page.locator("svg.chart line.deploy")).to_have_count(4)
    expect(page.locator('table[data-role="by-type"] tr[data-key]')).to_have_count(2)
    expect(page.locator('table[data-role="by-type"] tr[data-key="PlaceOrder"] td').nth(1)).to_have_text("7")
    expect(page.locator('table[data-role="by-worker"] tr[data-key]')).to_have_count(1)
    page.screenshot(path=str(shots / "monitoring-queue.png"), full_page=True)
    page.locator('a[data-role="failed-badge"]').click()
    page.wait_for_url(f"**/failed/?queue={busy_queue}")
    assert net.failures == [] and csp == []
