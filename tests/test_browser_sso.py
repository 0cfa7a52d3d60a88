"""One whole single sign-on in Chromium: from the dashboard's login page to the OpenID Connect
provider on 127.0.0.1 (tests/oidc_provider.py, which approves at once) and back, landing on
the page first asked for with the role the provider's groups give; then out again.  With
the password form switched off the page offers only the provider."""
from __future__ import annotations

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache  # noqa: F401
from tests.oidc_provider import provider  # noqa: F401 — a fixture

from playwright.sync_api import expect  # noqa: E402

pytestmark = BROWSER_MARKS


def test_single_sign_on_in_the_browser(live_server, page, provider, settings):
    settings.SLUICE_LOCAL_LOGIN = False
    settings.SLUICE_OIDC_PROVIDER_NAME = "Example ID"
    provider.log_in_as("olga", groups=["sluice-operator"])
    net = NetworkLog(page)
    csp: list[str] = []
    page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(f"{live_server.url}/failed/")
    page.wait_for_url("**/accounts/login/?next=/failed/")
    expect(page.get_by_label("Password")).to_have_count(0)  # passwords are off here
    page.get_by_role("link", name="Log in with Example ID").click()
    page.wait_for_url(f"{live_server.url}/failed/")
    assert "GET /authorize" in provider.seen and "POST /token" in provider.seen
    expect(page.locator(".topbar .user")).to_contain_text("olga")
    expect(page.locator(".topbar .user .tag")).to_have_text("operator")
    expect(page.locator('[data-role="viewer"]')).to_have_count(0)  # no "you can look but not act"

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/accounts/login/")
    page.goto(f"{live_server.url}/")
    page.wait_for_url("**/accounts/login/?next=/")
    assert net.failures == [] and csp == []
