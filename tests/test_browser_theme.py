"""The dark theme and the favicon in Chromium: the page follows the system's colour scheme
(Playwright's emulated ``prefers-color-scheme``), the toggle switches it and the choice
survives a reload (drawn by the server from its cookie: the first paint already has it), the
charts change colour with it, nothing breaks the Content-Security-Policy, and
``/favicon.ico`` ends at the icon.  Writes docs/screenshots/theme-light.png and
theme-dark.png with ``SLUICE_SCREENSHOTS=1`` (else to a temporary directory)."""
from __future__ import annotations

import os

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.conftest import ROOT
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.monitoring_support import busy_queue  # noqa: F401 — a fixture

from playwright.sync_api import expect  # noqa: E402

pytestmark = BROWSER_MARKS

#: The page background of each theme (sluice.css: --bg), as the browser computes it.
BACKGROUND = {"light": "rgb(246, 248, 250)", "dark": "rgb(15, 22, 32)"}
#: The first chart's first series (handled/s, --chart-blue) in each theme.
BLUE = {"light": "rgb(37, 99, 235)", "dark": "rgb(110, 160, 255)"}


def background(page) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def chart_line(page) -> str:
    return page.locator("svg.chart polyline").first.evaluate("e => getComputedStyle(e).stroke")


def watch_csp(page) -> list[str]:
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
    return csp


@pytest.fixture
def dark_page(browser, browser_context_args):
    """A page whose system prefers the dark scheme."""
    context = browser.new_context(**browser_context_args, color_scheme="dark")
    try:
        yield context.new_page()
    finally:
        context.close()


def test_toggle_switches_the_theme_and_a_reload_keeps_it(live_server, page, busy_queue, tmp_path):
    make_user("viewer", "vera")
    net, csp = NetworkLog(page), watch_csp(page)
    login(page, live_server.url, "vera", path=f"/monitoring/{busy_queue}/?period=1h")
    toggle = page.get_by_role("button", name="Dark theme")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    assert background(page) == BACKGROUND["light"] and chart_line(page) == BLUE["light"]
    shots = ROOT / "docs" / "screenshots" if os.environ.get("SLUICE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "theme-light.png"), full_page=True)

    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "true")
    assert background(page) == BACKGROUND["dark"] and chart_line(page) == BLUE["dark"]
    page.screenshot(path=str(shots / "theme-dark.png"), full_page=True)

    # A reload: the server's answer already names the theme, before any script runs.
    response = page.reload()
    assert '<html lang="en" data-theme="dark">' in response.text()
    expect(page.get_by_role("button", name="Dark theme")).to_have_attribute("aria-pressed", "true")
    assert background(page) == BACKGROUND["dark"] and chart_line(page) == BLUE["dark"]
    # Every page keeps it, the login page too once logged out.
    page.goto(f"{live_server.url}/failed/")
    assert background(page) == BACKGROUND["dark"]
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/accounts/login/")
    assert background(page) == BACKGROUND["dark"]

    # Back to light, which the system prefers: the cookie is forgotten, the system followed.
    page.get_by_role("button", name="Dark theme").click()
    assert background(page) == BACKGROUND["light"]
    assert [c for c in page.context.cookies() if c["name"] == "sluice_theme"] == []
    page.reload()
    assert background(page) == BACKGROUND["light"]
    assert net.failures == [] and csp == []


def test_a_system_that_prefers_dark_gets_the_dark_theme_without_a_toggle(live_server, dark_page, busy_queue):
    page = dark_page
    make_user("viewer", "dora")
    net, csp = NetworkLog(page), watch_csp(page)
    page.goto(f"{live_server.url}/accounts/login/")
    assert background(page) == BACKGROUND["dark"]
    login(page, live_server.url, "dora", path=f"/monitoring/{busy_queue}/?period=1h")
    assert background(page) == BACKGROUND["dark"] and chart_line(page) == BLUE["dark"]
    toggle = page.get_by_role("button", name="Dark theme")
    expect(toggle).to_have_attribute("aria-pressed", "true")
    # The visitor prefers light here, whatever the system says: kept across a reload.
    toggle.click()
    expect(toggle).to_have_attribute("aria-pressed", "false")
    page.reload()
    assert background(page) == BACKGROUND["light"] and chart_line(page) == BLUE["light"]
    assert net.failures == [] and csp == []


def test_favicon(live_server, page):
    make_user("viewer", "fay")
    net = NetworkLog(page)
    answer = page.goto(f"{live_server.url}/favicon.ico")
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    assert answer.request.redirected_from.url == f"{live_server.url}/favicon.ico"
    # The pages link the icon themselves; it loads.
    page.goto(f"{live_server.url}/accounts/login/")
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert page.request.get(f"{live_server.url}{icon}").status == 200
    assert net.failures == []
