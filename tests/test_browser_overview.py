"""The overview page (``GET /``) in a real browser: headless Debian Chromium driven by
Playwright, against pytest-django's live server.  Setup: tests/browser_support.py."""
from __future__ import annotations

import re
import uuid

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402

pytestmark = BROWSER_MARKS


@pytest.fixture
def browser_queue(live_server):
    """A queue with a name of its own (queue tables survive the test database flush);
    dropped again at teardown, before the flush."""
    name = f"b_{uuid.uuid4().hex[:8]}"
    create_queue(name)
    yield name
    try:
        delete_queue(name)
    finally:
        registry.forget(name)


def test_overview_shows_counts_and_refreshes_live(live_server, page, browser_queue, settings):
    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 0.5

    user = make_user("viewer")
    transport = Transport()
    for _ in range(3):
        transport.send(browser_queue, b"x", message_type="Ping")
    transport.send(browser_queue, b"x", message_type="Ping", ttl=0)  # expired at once

    net = NetworkLog(page)
    login(page, live_server.url, user.username)
    expect(page).to_have_title(re.compile("Overview · Sluice"))
    row = page.locator(f'tr[data-queue="{browser_queue}"]')
    expect(row).to_have_count(1)
    expect(row.locator("td.pending")).to_have_text("3")
    expect(row.locator("td.expired")).to_have_text("1")

    # The numbers region polls /partials/overview/: new messages appear without a reload.
    transport.send(browser_queue, b"x", message_type="Ping")
    transport.send(browser_queue, b"x", message_type="Ping")
    with page.expect_response(lambda r: r.url.endswith("/partials/overview/"), timeout=8_000) as poll:
        pass
    assert poll.value.status == 200
    expect(row.locator("td.pending")).to_have_text("5", timeout=10_000)
    expect(row.locator("td.expired")).to_have_text("1")
    assert net.failures == []
