"""Forms submitted AS THE PAGES RENDER THEM, in Chromium (issue 20 items 4 and 6): "Archive
old" on /failed/, an action that fails says so on the page, edit-and-retry keeps the bytes
nobody touched and takes a body up to SLUICE_MAX_BODY_BYTES.  Setup: tests/browser_support.py."""
from __future__ import annotations

import datetime as dt


from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, celery_worker, login, worker_broker,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user  # noqa: F401
from tests.test_browser_dashboard import shop  # noqa: F401 — fixture

from playwright.sync_api import expect  # noqa: E402

from core.models import BulkOperation  # noqa: E402
from core.transport import Transport  # noqa: E402

pytestmark = BROWSER_MARKS
MIB = 1024 * 1024


def ready(page, button) -> None:
    """Wait until htmx has processed the button (a click before that is a plain form post)."""
    page.wait_for_function("b => !!b['htmx-internal-data']", arg=button.element_handle(), timeout=30_000)


def click_archive_old(page, base_url: str) -> None:
    """As an operator on /failed/: the "Archive old" button as rendered (7 days), confirmed."""
    login(page, base_url, make_user("operator").username, "/failed/")
    page.on("dialog", lambda d: d.accept())
    button = page.get_by_role("button", name="Archive old")
    ready(page, button)
    button.click()


def test_archive_old_as_rendered_starts_an_archive(live_server, page, shop):
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
    fail_message(shop, failed_at=old)
    fail_message(shop)
    click_archive_old(page, live_server.url)
    expect(page.locator(".messages")).to_contain_text("Archive of 1 message(s) started")
    op = BulkOperation.objects.get()
    assert op.kind == "archive" and op.total == 1


def test_archive_old_with_nothing_that_old_says_so_on_the_page(live_server, page, shop):
    fail_message(shop)
    click_archive_old(page, live_server.url)
    expect(page.locator("#flash")).to_contain_text("nothing to archive")
    assert BulkOperation.objects.count() == 0


def test_edit_and_retry_keeps_untouched_crlf_and_leading_newline(live_server, page, shop):
    original = "\nline one\r\nline two\r\n"
    record = fail_message(shop, body=original, headers={"Tenant": "acme"})
    net = NetworkLog(page)
    login(page, live_server.url, make_user("operator").username, f"/failed/{record.pk}/edit/")
    page.get_by_label("Value of Tenant").fill("globex")  # the body is not touched
    page.get_by_role("button", name="Send the edited copy").click()
    page.wait_for_url(f"{live_server.url}/failed/{record.pk}/")
    expect(page.locator(".messages")).to_contain_text("Edited copy sent")
    (copy,) = Transport().browse(shop)
    assert copy.body == original.encode() and copy.headers["Tenant"] == "globex"
    assert net.failures == []


def test_edit_and_retry_takes_a_4_mib_body(live_server, page, shop):
    record = fail_message(shop, body="a\r\nb")
    login(page, live_server.url, make_user("operator").username, f"/failed/{record.pk}/edit/")
    big = "q" * (4 * MIB - 64)
    page.get_by_label("Body").fill(big + "\nend")
    page.get_by_role("button", name="Send the edited copy").click()
    page.wait_for_url(f"{live_server.url}/failed/{record.pk}/", timeout=60_000)
    expect(page.locator(".messages")).to_contain_text("Edited copy sent")
    (copy,) = Transport().browse(shop)
    assert copy.body == (big + "\r\nend").encode()  # the stored body's CRLF style


def test_retry_all_unresolved_under_a_search_retries_what_the_search_shows(live_server, page, shop):
    shown = [fail_message(shop, exception_message=f"card declined {i}") for i in range(3)]
    fail_message(shop, exception_message="timeout")
    fail_message(shop, exception_message="timeout")
    login(page, live_server.url, make_user("operator").username, "/failed/")
    page.on("dialog", lambda d: d.accept())
    page.get_by_label("Text").fill("declined")
    page.get_by_role("button", name="Search").click()
    expect(page.locator("#failures tbody tr")).to_have_count(3)
    button = page.get_by_role("button", name="Retry all unresolved")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text("Retry of 3 message(s) started")
    op = BulkOperation.objects.get()
    assert op.total == 3 and sorted(op.selection["ids"]) == sorted(r.message_id for r in shown)


def test_purge_as_rendered_runs_on_a_worker_with_a_progress_bar(live_server, page, shop, worker_broker):
    Transport().send_many(shop, [f"m{i}" for i in range(30)])
    login(page, live_server.url, make_user("operator").username, f"/queues/{shop}/")
    page.get_by_text("Purge this queue…").click()
    page.get_by_label("Queue name").fill(shop)
    page.get_by_role("button", name=f"Purge {shop}").click()
    expect(page.locator(".messages")).to_contain_text(f"Purge of {shop} started")
    op = page.locator("#operations [data-operation]").first
    expect(op).to_have_attribute("data-status", "finished", timeout=30_000)
    expect(op).to_contain_text("30 done of 30")
    assert Transport().browse(shop) == []
