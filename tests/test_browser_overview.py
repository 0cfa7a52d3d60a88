"""The overview page (``GET /``) in a real browser: headless Debian Chromium driven by
Playwright, against pytest-django's live server.

Setup (see /work/shared/STACK-NOTES.md, "Browser tests"): ``apt-get install -y chromium``
and ``pip install playwright pytest-playwright``; never ``playwright install``.
"""
from __future__ import annotations

import os
import re
import uuid

import pytest

# Playwright's sync API runs an event loop in the test thread; without this Django's
# ORM refuses to run there (SynchronousOnlyOperation).  Set before the live server or
# any fixture touches the database.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import expect  # noqa: E402

from core.models import QueueRecord  # noqa: E402
from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = "/tmp/sluice-overview.png"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}"),
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium instead of Playwright's downloaded browsers."""
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    }


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


def test_overview_shows_counts_and_refreshes_live(live_server, page, browser_queue):
    transport = Transport()
    for _ in range(3):
        transport.send(browser_queue, b"x", message_type="Ping")
    transport.send(browser_queue, b"x", message_type="Ping", ttl=0)  # expired at once

    server_errors = []
    page.on("response", lambda r: server_errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
    response = page.goto(live_server.url + "/")
    assert response is not None and response.status == 200

    expect(page).to_have_title(re.compile("Sluice"))
    row = page.locator(f'tr[data-queue="{browser_queue}"]')
    expect(row).to_have_count(1)
    expect(row.locator("td.pending")).to_have_text("3")
    expect(row.locator("td.expired")).to_have_text("1")
    expect(page.locator("p.problem")).to_have_count(0)

    # The page polls /partials/queues/ every 2 s: new messages appear without a reload.
    transport.send(browser_queue, b"x", message_type="Ping")
    transport.send(browser_queue, b"x", message_type="Ping")
    with page.expect_response(lambda r: r.url.endswith("/partials/queues/"), timeout=6_000) as poll:
        pass
    assert poll.value.status == 200
    expect(row.locator("td.pending")).to_have_text("5", timeout=6_000)
    expect(row.locator("td.expired")).to_have_text("1")

    page.screenshot(path=SCREENSHOT, full_page=True)
    assert server_errors == []


def test_overview_without_queues_of_its_own_renders(live_server, page):
    """The page renders without a server error whatever the registry holds: with no
    queues registered it shows the "No queues yet" hint."""
    response = page.goto(live_server.url + "/")
    assert response is not None and response.status == 200
    expect(page.locator("#queues table")).to_be_visible()
    expect(page.locator("p.problem")).to_have_count(0)
    if not QueueRecord.objects.exists():
        expect(page.get_by_text("No queues yet")).to_be_visible()
    else:
        expect(page.locator("tr[data-queue]")).to_have_count(QueueRecord.objects.count())

    partial = page.request.get(live_server.url + "/partials/queues/")
    assert partial.status == 200
    assert "<table>" in partial.text()
