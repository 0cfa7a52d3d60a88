"""Operator controls in Chromium, as the pages render them: the overview's Pause button stops
a running worker within a second while a producer keeps sending, the badge shows, Resume on
the queue page lets it drain within a second; the send form refuses bad JSON, then a good
send opens the new message's page; limits set on the queue page hold for a running worker.
Setup: tests/browser_support.py.

The pages' screenshots for docs/operations/queue-controls.md (``queue-paused.png``,
``send-form.png``) and docs/operations/queue-limits.md (``queue-limits.png``) go to docs/screenshots/ with ``SLUICE_SCREENSHOTS=1``, else to a
temporary directory."""
from __future__ import annotations

import os
import time
from pathlib import Path


from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.test_browser_dashboard import shop  # noqa: F401 — fixture
from tests.conftest import ROOT, wait_for
from tests.test_queue_pause import Producer

from playwright.sync_api import expect  # noqa: E402

from core.runtime import pauses  # noqa: E402
from core.transport import Transport  # noqa: E402
from core.worker import WorkerHost  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = BROWSER_MARKS


def screenshot(page, tmp_path: Path, name: str) -> None:
    folder = ROOT / "docs" / "screenshots" if os.environ.get("SLUICE_SCREENSHOTS") == "1" else tmp_path
    page.screenshot(path=str(folder / name))


def test_pause_from_the_overview_and_resume_from_the_queue_page(live_server, page, shop, temp_handlers, settings,
                                                                 tmp_path):
    settings.SLUICE_PEEK_DELAY = 1.0
    handled: list[float] = []
    temp_handlers(shop, None, lambda message, context: handled.append(time.monotonic()))
    host = WorkerHost([shop], mover=False, alerts=False).start()
    producer = Producer(shop, every=0.05)
    producer.start()
    network = NetworkLog(page)
    operator = make_user("operator")
    try:
        login(page, live_server.url, operator.username)
        row = page.locator(f'tr[data-queue="{shop}"]')
        expect(row.locator(f'[data-paused="{shop}"]')).to_have_count(0)
        page.get_by_role("button", name=f"Pause {shop}").click()
        expect(page.locator("ul.messages").filter(has_text=f"queue {shop} paused")).to_be_visible()
        clicked = time.monotonic()
        badge = page.locator(f'tr[data-queue="{shop}"] [data-paused="{shop}"]')
        expect(badge).to_have_text("paused")
        expect(page.locator('[data-total="paused"]')).to_have_text("1")
        time.sleep(1.5)
        assert not [t for t in handled if t > clicked + 1.0], "handled more than 1 s after the pause"
        waiting = Transport().counts(shop).pending
        assert waiting > 5, "the producer's sends keep landing"
        assert pauses.pause_of(shop).paused_by == operator.username

        page.locator(f'tr[data-queue="{shop}"] a').first.click()
        page.wait_for_url(f"**/queues/{shop}/")
        expect(page.locator("[data-pause-banner]")).to_contain_text("Paused")
        screenshot(page, tmp_path, "queue-paused.png")
        before = time.monotonic()
        page.get_by_role("button", name=f"Resume {shop}").click()
        expect(page.locator("[data-pause-banner]")).to_have_count(0)  # reloaded: the resume committed
        committed = time.monotonic()
        wait_for(lambda: any(t > before for t in handled), timeout=max(committed + 1.0 - time.monotonic(), 0.05),
                 interval=0.01, what="handling within 1 s of the resume")
        wait_for(lambda: Transport().counts(shop).pending < waiting, timeout=5, what="the backlog draining")
        expect(page.get_by_role("button", name=f"Pause {shop}")).to_be_visible()
        assert [e.action for e in AuditEntry.objects.order_by("pk")] == ["pause_queue", "resume_queue"]
        assert network.failures == []
    finally:
        producer.stop()
        host.stop()


def test_the_send_form_shows_a_json_error_then_a_good_send_opens_the_message_page(live_server, page, shop,
                                                                                  tmp_path):
    network = NetworkLog(page)
    login(page, live_server.url, make_user("operator").username, f"/queues/{shop}/")
    page.get_by_role("link", name=f"Send a message to {shop}…").click()
    page.wait_for_url(f"**/send/?queue={shop}")
    expect(page.get_by_label("Queue")).to_have_value(shop)
    page.get_by_label("Message type").fill("PlaceOrder")
    page.get_by_label("Body (JSON)").fill('{"order": 42,}')
    page.get_by_label("Headers (JSON object)").fill('{"Tenant": "acme"}')
    page.get_by_role("button", name="Send").click()
    expect(page.locator("[data-send-error]")).to_contain_text("the body is not JSON")
    expect(page.get_by_label("Message type")).to_have_value("PlaceOrder")  # kept
    screenshot(page, tmp_path, "send-form.png")
    assert Transport().browse(shop) == []

    page.get_by_label("Body (JSON)").fill('{"order": 42}')
    page.get_by_role("button", name="Send").click()
    page.wait_for_url(f"**/queues/{shop}/messages/*/")
    expect(page.locator("ul.messages")).to_contain_text(f"sent to {shop}")
    expect(page.locator("main, body").first).to_contain_text("PlaceOrder")
    [m] = Transport().browse(shop)
    assert m.body == b'{"order": 42}' and m.headers["Tenant"] == "acme"
    assert page.url.endswith(f"/queues/{shop}/messages/{m.row_version}/")
    assert [e.outcome for e in AuditEntry.objects.filter(action="send_message").order_by("pk")] == ["rejected", "ok"]
    assert [f for f in network.failures if "/send/" not in f] == []  # the refused send is a 400 by design


def test_limits_set_on_the_queue_page_hold_for_a_running_worker(live_server, page, shop, temp_handlers, settings,
                                                                tmp_path):
    """The page's Limits form: 5 a second set by an operator, a running worker under a
    producer's load keeps to it from its next receive; Clear gives the queue back."""
    settings.SLUICE_QUEUE_LIMITS = {shop: {"concurrency": 2}}
    starts: list[float] = []
    temp_handlers(shop, None, lambda message, context: starts.append(time.time()))
    Transport().send_many(shop, [{"n": n} for n in range(40)])
    network = NetworkLog(page)
    operator = make_user("operator")
    login(page, live_server.url, operator.username, f"/queues/{shop}/")
    form = page.locator(f'[data-limits="{shop}"]')
    expect(form.locator('[data-limit-source="settings"]')).to_be_visible()
    expect(page.get_by_label("At once")).to_have_value("2")
    page.get_by_label("At once").fill("1")
    page.get_by_label("Per second").fill("5")
    page.get_by_role("button", name="Set limits").click()
    expect(page.locator("ul.messages").filter(has_text="at most 5 per second")).to_be_visible()
    expect(form.locator('[data-limit-source="database"]')).to_be_visible()
    screenshot(page, tmp_path, "queue-limits.png")
    host = WorkerHost([shop], mover=False, alerts=False).start()
    try:
        time.sleep(2.5)
    finally:
        host.stop()
    assert 5 <= len(starts) <= 15  # 5 a second, from the first receive
    assert max(sum(1 for t in starts if s <= t < s + 0.999) for s in starts) <= 5
    page.get_by_role("button", name="Clear").click()
    expect(form.locator('[data-limit-source="settings"]')).to_be_visible()
    assert [e.action for e in AuditEntry.objects.order_by("pk")] == ["limit_queue", "limit_queue"]
    assert network.failures == []
