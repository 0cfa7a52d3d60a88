"""The dark theme and the favicon, without a browser: every text colour of both themes
against its background passes WCAG AA (4.5:1, computed from the stylesheet's variables),
the charts take their colours from those variables, the server draws the chosen theme
into <html> (no flash before a script runs), and ``/favicon.ico`` leads to the icon wherever
the dashboard is mounted.  The toggle itself: tests/test_browser_theme.py."""
from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.urls import set_script_prefix

from dashboard.charts.sparklines import sparkline
from dashboard.charts.svgchart import Series, line_chart
from dashboard.conversation.svg import COLORS as FLOW_COLORS
from dashboard.views.charts import COLORS as METRIC_COLORS
from dashboard.views.monitoring import COLORS as MONITORING_COLORS
from tests.conftest import ROOT
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401

CSS = (ROOT / "dashboard" / "static" / "dashboard" / "sluice.css").read_text()

#: Text colour → the backgrounds it is drawn on (sluice.css's rules, pair by pair).
TEXT_ON = {
    "--fg": ["--bg", "--card", "--th-bg", "--row-hover", "--control-bg", "--control-hover", "--progress-bg",
             "--progress-bar", "--progress-done", "--progress-failed", "--chart-bg", "--idle-bg"],
    "--muted": ["--bg", "--card", "--th-bg", "--row-hover", "--idle-bg"],
    "--accent": ["--bg", "--card", "--row-hover", "--th-bg"],
    "--on-accent": ["--accent", "--accent-hover", "--bad"],
    "--ok": ["--ok-bg", "--card"], "--bad": ["--bad-bg", "--card", "--chart-bg", "--control-bg"],
    "--warn": ["--warn-bg", "--card"], "--info": ["--info-bg", "--card"],
    "--dim": ["--dim-bg", "--card", "--row-hover"],
    "--bad-text": ["--bad-bg"], "--warn-text": ["--warn-bg"], "--ok-text": ["--ok-bg"], "--info-text": ["--info-bg"],
    "--code-fg": ["--code-bg"],
    "--topbar-fg": ["--topbar-bg", "--topbar-hover"], "--topbar-strong": ["--topbar-bg", "--topbar-current",
                                                                          "--topbar-hover"],
    "--chart-text": ["--chart-bg"], "--chart-caption": ["--chart-bg"], "--chart-violet": ["--chart-bg"],
    "--flow-retry": ["--chart-bg"], "--flow-line": ["--chart-bg"],
}
#: Lines and bars (not text): WCAG's 3:1 for graphical objects, against the chart's background.
GRAPHICS_ON_CHART = ["--chart-blue", "--chart-green", "--chart-amber", "--chart-red", "--chart-violet",
                     "--chart-cyan", "--chart-crimson", "--flow-processing", "--flow-retry", "--flow-line"]


def theme_colours() -> dict[str, dict[str, str]]:
    """{"light": {"--fg": "#1d2733", …}, "dark": {…}} from the :root block's variables."""
    root = re.search(r":root\s*{(.*?)}", CSS, re.S).group(1)
    themes: dict[str, dict[str, str]] = {"light": {}, "dark": {}}
    for name, value in re.findall(r"(--[\w-]+):\s*([^;]+);", root):
        pair = re.fullmatch(r"light-dark\(\s*(#\w+)\s*,\s*(#\w+)\s*\)", value.strip())
        light, dark = pair.groups() if pair else (value.strip(), value.strip())
        themes["light"][name], themes["dark"][name] = light, dark
    return themes


def luminance(colour: str) -> float:
    """WCAG 2 relative luminance of #rgb / #rrggbb."""
    hex_digits = colour.lstrip("#")
    if len(hex_digits) == 3:
        hex_digits = "".join(c * 2 for c in hex_digits)
    channels = [int(hex_digits[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_contrast_helper_agrees_with_wcag_reference_values():
    assert contrast("#000", "#fff") == pytest.approx(21.0)
    assert contrast("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)  # the well-known just-fails grey


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_text_colour_passes_wcag_aa_on_its_backgrounds(theme):
    colours = theme_colours()[theme]
    ratios = {(fg, bg): contrast(colours[fg], colours[bg]) for fg, bgs in TEXT_ON.items() for bg in bgs}
    failing = {f"{fg} on {bg}": round(r, 2) for (fg, bg), r in ratios.items() if r < 4.5}
    assert failing == {}, f"{theme} theme below 4.5:1: {failing}"
    # Both themes define every variable, and the dark one differs where it matters.
    assert theme_colours()["dark"]["--bg"] != theme_colours()["light"]["--bg"]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_chart_lines_stand_out_from_the_chart_background(theme):
    colours = theme_colours()[theme]
    weak = {name: round(contrast(colours[name], colours["--chart-bg"]), 2) for name in GRAPHICS_ON_CHART
            if contrast(colours[name], colours["--chart-bg"]) < 3}
    assert weak == {}, f"{theme} theme: chart colours below 3:1: {weak}"


def test_no_colour_is_written_outside_the_theme_variables():
    """A hard-coded colour in a rule would be the same in both themes (unreadable in one)."""
    rules = re.sub(r":root\s*{.*?}", "", CSS, count=1, flags=re.S)
    rules = re.sub(r"/\*.*?\*/", "", rules, flags=re.S)
    assert re.findall(r"#[0-9a-fA-F]{3,6}\b|rgba?\(", rules) == []


def test_the_charts_draw_with_the_theme_variables():
    """Every series colour the views hand the SVG charts is a variable of the stylesheet."""
    defined = set(theme_colours()["light"])
    for colours in (MONITORING_COLORS, METRIC_COLORS, FLOW_COLORS):
        for value in colours.values():
            name = re.fullmatch(r"var\((--[\w-]+)\)", value)
            assert name and name.group(1) in defined, value
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    points = [(t0 + dt.timedelta(minutes=i), float(i)) for i in range(5)]
    for svg in (line_chart("throughput", [Series("handled/s", MONITORING_COLORS["throughput"], points)]),
                sparkline("orders", points, (t0, points[-1][0]))):
        assert "stroke:var(--chart-blue)" in svg
        assert not re.search(r'(fill|stroke)="#', svg)


@pytest.mark.django_db
@pytest.mark.parametrize("cookie, attribute", [("dark", ' data-theme="dark"'), ("light", ' data-theme="light"'),
                                                ('"><script>', None), (None, None)])
def test_the_server_draws_the_chosen_theme_into_every_page(cookie, attribute):
    client = Client()
    client.force_login(make_user("viewer"))
    if cookie is not None:
        client.cookies["sluice_theme"] = cookie
    for path in ("/", "/accounts/login/", "/no-such-page/"):
        page = client.get(path).content.decode()
        html = re.search(r"<html[^>]*>", page).group(0)
        assert html == f'<html lang="en"{attribute or ""}>', (path, html)
        assert '<link rel="icon" href="/static/dashboard/favicon.svg" type="image/svg+xml">' in page
        assert 'src="/static/dashboard/theme.js" defer' in page
        assert "<script>" not in page  # nothing inline: the Content-Security-Policy stays strict


@pytest.fixture
def behind_a_proxy_prefix(settings):
    """Served under /intranet (a proxy's SCRIPT_NAME), as gunicorn does per request: the test
    client leaves the script prefix alone, so it is set here; STATIC_URL is read afresh."""
    set_script_prefix("/intranet/")
    settings.STATIC_URL = "static/"  # Django adds the prefix to a relative STATIC_URL when read
    try:
        yield "/intranet"
    finally:
        set_script_prefix("/")


@pytest.mark.django_db
def test_the_toggle_keeps_its_cookie_on_the_dashboards_own_path(behind_a_proxy_prefix):
    client = Client()
    client.force_login(make_user("operator"))
    page = client.get("/", SCRIPT_NAME=behind_a_proxy_prefix).content.decode()
    assert 'data-theme-toggle data-cookie-path="/intranet/"' in page
    assert '<link rel="icon" href="/intranet/static/dashboard/favicon.svg"' in page


@pytest.mark.django_db
def test_favicon_ico_leads_to_the_icon():
    response = Client().get("/favicon.ico")  # no login: browsers ask before anyone logs in
    assert response.status_code == 302
    assert response["Location"] == "/static/dashboard/favicon.svg"
    assert "max-age=86400" in response["Cache-Control"]
    icon = ROOT / "dashboard" / "static" / "dashboard" / "favicon.svg"
    assert icon.read_text().startswith('<svg xmlns="http://www.w3.org/2000/svg"')


@pytest.mark.django_db
def test_favicon_behind_a_script_prefix_keeps_the_prefix(behind_a_proxy_prefix):
    response = Client().get("/favicon.ico", SCRIPT_NAME=behind_a_proxy_prefix)
    assert response["Location"] == "/intranet/static/dashboard/favicon.svg"


@pytest.mark.django_db
@pytest.mark.urls("tests.prefix_urls")
def test_favicon_in_a_host_project_under_a_prefix():
    response = Client().get("/ops/favicon.ico")
    assert response.status_code == 302 and response["Location"] == "/static/dashboard/favicon.svg"
    # The host's own root stays the host's: its pages link the icon themselves if they want it.
    assert Client().get("/").content == b"the host project's own page"
