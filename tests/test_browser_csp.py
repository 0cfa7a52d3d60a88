"""Every page under the Content-Security-Policy in Chromium (issue 20 item 11): the header is
there and the browser reports no violation (no inline script, no eval: htmx's polling and
confirmations still work), as an operator on every page the layout links to and the detail
pages behind them."""
from __future__ import annotations

import uuid

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user  # noqa: F401

from core.messages import Headers  # noqa: E402
from core.queues import create_queue, delete_queue  # noqa: E402
from core.transport import Transport  # noqa: E402

pytestmark = BROWSER_MARKS

#: Records securitypolicyviolation events before any page script runs.
LISTEN = """window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' ' + e.sourceFile + ':' + e.lineNumber));"""


@pytest.fixture
def seeded(live_server, error_queue):
    name = f"csp_{uuid.uuid4().hex[:8]}"
    create_queue(name)
    Transport().send(name, '{"order": 1}', message_id="m-1")
    record = fail_message(name, headers={Headers.CONVERSATION_ID: f"conv-{name}"})
    yield name, record
    delete_queue(name)


def test_no_page_violates_the_content_security_policy(live_server, page, seeded):
    name, record = seeded
    user = make_user("operator")
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.add_init_script(LISTEN)
    network = NetworkLog(page)
    login_page = page.goto(f"{live_server.url}/accounts/login/")
    assert "script-src 'self'" in login_page.headers["content-security-policy"]
    login(page, live_server.url, user.username)
    row_version = Transport().browse(name, limit=1)[0].row_version
    paths = ["/", "/failed/", "/failed/?view=all", "/delayed/", "/outbox/", "/audit/", "/metrics/charts/",
             f"/queues/{name}/", f"/queues/{name}/messages/{row_version}/", f"/failed/{record.pk}/",
             f"/failed/{record.pk}/edit/", "/conversations/", f"/conversations/{record.conversation_id}/"]
    for path in paths:
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, path
        assert "unsafe-eval" not in response.headers["content-security-policy"]
        assert response.headers["permissions-policy"]
        page.wait_for_timeout(300)  # the overview's poll and any deferred script have run
        assert page.evaluate("window.__csp") == [], path
    # The overview's htmx polling (eval-free) still swaps fresh numbers in.
    page.goto(f"{live_server.url}/")
    with page.expect_response(lambda r: "/partials/overview/" in r.url, timeout=15_000) as poll:
        pass
    assert poll.value.status == 200
    assert page.evaluate("window.__csp") == []
    assert not [e for e in console_errors if "Content Security Policy" in e or "Content-Security-Policy" in e]
    assert network.failures == []
