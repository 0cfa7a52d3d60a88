"""Crafted message data in Chromium, as the pages render (issue 35 items 1-3): the queue
filter of a masked header lists a right and a wrong guess alike, a poison message's pages
show its masked header as ``***``, and /delayed/'s "Delete" of a message whose id is
``../alerts/rules/<pk>`` deletes that message, not the alert rule.  The same checks through
the test client: test_dashboard_hostile_data.py.  Setup: tests/browser_support.py."""
from __future__ import annotations

import json
import uuid

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.test_browser_actions import as_operator, ready
from tests.test_browser_dashboard import shop  # noqa: F401 — fixture

from playwright.sync_api import expect  # noqa: E402

from core import failures  # noqa: E402
from core.delayed import delayed_store  # noqa: E402
from core.models import AlertRule, FailedMessage  # noqa: E402
from core.queues import dialect  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402
from django.db import connection  # noqa: E402

pytestmark = BROWSER_MARKS

SECRET = "Bearer TOPSECRET-abc123"


@pytest.fixture
def masking(settings):
    settings.SLUICE_MASK_HEADERS = ("Authorization",)
    settings.SLUICE_MASK_BODY_FIELDS = ("number",)


def _rows_for(page, base_url: str, queue: str, header: str, value: str) -> int:
    page.goto(f"{base_url}/queues/{queue}/")
    page.get_by_label("Header").fill(header)
    page.get_by_label("contains").fill(value)
    page.get_by_role("button", name="Filter").click()
    page.wait_for_load_state()
    return page.locator("#messages tbody tr[data-row-version]").count()


def test_a_viewer_cannot_guess_a_masked_header_through_the_filter(live_server, page, shop, masking):
    Transport().send(shop, "{}", headers={"Authorization": SECRET})
    login(page, live_server.url, make_user("viewer").username, f"/queues/{shop}/")
    right = _rows_for(page, live_server.url, shop, "Authorization", "Bearer TOPSECRET-a")
    expect(page.get_by_role("alert")).to_contain_text("masked")
    wrong = _rows_for(page, live_server.url, shop, "Authorization", "Bearer TOPSECRET-b")
    assert right == wrong == 1
    assert "TOPSECRET" not in page.locator("#messages").inner_text()


def test_a_poison_messages_pages_show_its_masked_header_masked(live_server, page, shop, masking):
    raw = json.dumps({"Authorization": "Bearer POISON-SECRET-777", "Retries": 3})
    with connection.cursor() as cursor:
        for queue in (shop, "error"):  # one still in its queue, one in the error queue
            cursor.execute(dialect().insert_with_expires(queue), [str(uuid.uuid4()), None, None, None, raw, b"{}"])
    failures.ingest_errors()
    record = FailedMessage.objects.get()
    row_version = Transport().browse(shop)[0].row_version
    login(page, live_server.url, make_user("operator").username, f"/queues/{shop}/messages/{row_version}/")
    for path in (f"/queues/{shop}/messages/{row_version}/", f"/failed/{record.pk}/", f"/failed/{record.pk}/edit/"):
        page.goto(f"{live_server.url}{path}")
        text = page.locator("main").inner_text() + page.locator("main").inner_html()
        assert "Retries" in text and "***" in text, path
        assert "POISON-SECRET" not in text, path


def test_a_crafted_delayed_id_deletes_that_message_not_an_alert_rule(live_server, page, shop):
    rule = AlertRule.objects.create(name="backlog", kind="queue_length", threshold=10)
    delayed_store().setup_infrastructure()
    crafted = f"../alerts/rules/{rule.pk}"
    for message_id in (crafted, "%2E%2E/alerts/rules/" + str(rule.pk)):
        Transport().send(shop, "later", delay=86400, message_id=message_id)
    net = NetworkLog(page)
    as_operator(page, live_server.url, "/delayed/")
    # Only this test's rows: the delayed store outlives other tests' database flushes.
    rows = page.locator("#delayed tbody tr[data-delayed]", has_text=shop)
    for left in (1, 0):  # each click waits for its row to go (a flash from the last one may still show)
        button = rows.first.get_by_role("button", name="Delete")
        ready(page, button)
        button.click()
        expect(rows).to_have_count(left)
        expect(page.locator(".messages")).to_contain_text("deleted")
    assert AlertRule.objects.filter(pk=rule.pk).exists()
    assert not AuditEntry.objects.filter(action="delete_alert_rule").exists()
    assert AuditEntry.objects.filter(action="delete_delayed", outcome="ok").count() == 2
    assert [m for m in delayed_store().list(100)[0] if m.destination == shop] == []
    assert net.failures == []
