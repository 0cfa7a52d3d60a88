"""The rest of the pages' forms submitted AS THE PAGES RENDER THEM, in Chromium (issue 20 item
4): a failed message's Retry / Archive / Restore / Delete, "Retry selected" and "Delete
selected" on /failed/, a group's Archive and "Restore group", a queued message's Delete, the
filter forms of the queue, delayed and audit pages, and Log out.  Setup: tests/browser_support.py."""
from __future__ import annotations

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user  # noqa: F401
from tests.test_browser_actions import as_operator, delayed, ready  # noqa: F401 — fixture
from tests.test_browser_dashboard import shop  # noqa: F401 — fixture

from playwright.sync_api import expect  # noqa: E402

from core.models import BulkOperation, FailedMessage  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = BROWSER_MARKS


def click(page, button) -> None:
    ready(page, button)
    button.click()


# -- one failed message's page ---------------------------------------------------------------------

@pytest.mark.parametrize("label, kind", [("Retry", "retry"), ("Archive", "archive")])
def test_a_failed_messages_retry_and_archive_start_an_operation(live_server, page, shop, label, kind):
    record = fail_message(shop)
    net = NetworkLog(page)
    as_operator(page, live_server.url, f"/failed/{record.pk}/")
    click(page, page.get_by_role("button", name=label, exact=True))
    expect(page.locator(".messages")).to_contain_text(f"{kind.capitalize()} of 1 message(s) started")
    assert page.url == f"{live_server.url}/failed/{record.pk}/"  # the form's "next"
    op = BulkOperation.objects.get()
    assert op.kind == kind and op.total == 1
    assert net.failures == []


def test_an_archived_messages_restore_starts_an_operation(live_server, page, shop):
    record = fail_message(shop)
    FailedMessage.objects.filter(pk=record.pk).update(status="archived")
    as_operator(page, live_server.url, f"/failed/{record.pk}/")
    click(page, page.get_by_role("button", name="Restore", exact=True))
    expect(page.locator(".messages")).to_contain_text("Restore of 1 message(s) started")
    assert BulkOperation.objects.get().kind == "restore"


def test_a_failed_messages_delete_deletes_it_and_a_second_click_says_it_is_gone(live_server, page, shop):
    record = fail_message(shop)
    confirms = as_operator(page, live_server.url, f"/failed/{record.pk}/")
    button = page.get_by_role("button", name="Delete", exact=True)
    ready(page, button)
    FailedMessage.objects.filter(pk=record.pk).delete()  # another operator was quicker
    button.click()
    expect(page.locator("#flash")).not_to_be_empty()
    assert confirms and "Delete this failure record" in confirms[0]
    other = fail_message(shop)
    page.goto(f"{live_server.url}/failed/{other.pk}/")
    click(page, page.get_by_role("button", name="Delete", exact=True))
    expect(page.locator(".messages")).to_contain_text("1 failed message(s) deleted")
    assert not FailedMessage.objects.filter(pk=other.pk).exists()


# -- /failed/: the selection's buttons, a group's buttons -------------------------------------------

def test_retry_selected_retries_the_ticked_messages(live_server, page, shop):
    records = [fail_message(shop) for _ in range(3)]
    as_operator(page, live_server.url, "/failed/")
    for record in records[:2]:
        page.get_by_label(f"Select {record.message_id}").check()
    click(page, page.get_by_role("button", name="Retry selected"))
    expect(page.locator(".messages")).to_contain_text("Retry of 2 message(s) started")
    op = BulkOperation.objects.get()
    assert sorted(op.selection["ids"]) == sorted(r.message_id for r in records[:2])


def test_delete_selected_deletes_the_ticked_failure_records(live_server, page, shop):
    records = [fail_message(shop) for _ in range(3)]
    as_operator(page, live_server.url, "/failed/")
    page.get_by_label(f"Select {records[0].message_id}").check()
    click(page, page.get_by_role("button", name="Delete selected"))
    expect(page.locator(".messages")).to_contain_text("1 failed message(s) deleted")
    assert sorted(FailedMessage.objects.values_list("pk", flat=True)) == sorted(r.pk for r in records[1:])


def test_a_groups_archive_and_restore_as_rendered(live_server, page, shop):
    record = fail_message(shop, frame="archive_me")
    as_operator(page, live_server.url, "/failed/")
    row = page.locator(f'#groups tr[data-group="{record.group_key}"]')
    click(page, row.get_by_role("button", name="Archive"))
    expect(page.locator(".messages")).to_contain_text("Archive of 1 message(s) started")
    assert BulkOperation.objects.get().kind == "archive"
    FailedMessage.objects.filter(pk=record.pk).update(status="archived")  # what the worker does
    page.goto(f"{live_server.url}/failed/?status=archived")
    click(page, page.locator(f'#groups tr[data-group="{record.group_key}"]').get_by_role("button",
                                                                                       name="Restore group"))
    expect(page.locator(".messages")).to_contain_text("Restore of 1 message(s) started")


# -- a queued message's Delete ----------------------------------------------------------------------

def test_a_queued_messages_delete_deletes_it(live_server, page, shop):
    Transport().send_many(shop, ["a", "b"])
    first, second = Transport().browse(shop)
    as_operator(page, live_server.url, f"/queues/{shop}/messages/{first.row_version}/")
    click(page, page.get_by_role("button", name="Delete", exact=True))
    expect(page.locator(".messages")).to_contain_text(f"1 message(s) deleted from {shop}")
    assert page.url == f"{live_server.url}/queues/{shop}/"
    assert [m.row_version for m in Transport().browse(shop)] == [second.row_version]


# -- the filter forms, Log out ----------------------------------------------------------------------

def test_the_queue_filter_shows_what_matches(live_server, page, shop):
    Transport().send(shop, {"n": 1}, message_type="PlaceOrder")
    Transport().send(shop, {"n": 2}, message_type="CancelOrder")
    login(page, live_server.url, make_user("viewer").username, f"/queues/{shop}/")
    expect(page.locator('#selection input[name="ids"]')).to_have_count(2)
    page.get_by_label("Message type").fill("CancelOrder")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator('#selection input[name="ids"]')).to_have_count(1)
    assert "type=CancelOrder" in page.url


def test_the_delayed_filter_shows_one_destination(live_server, page, shop, delayed):
    mine = delayed()
    login(page, live_server.url, make_user("viewer").username, "/delayed/")
    page.get_by_label("Destination").select_option(shop)
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#delayed tbody tr[data-delayed]")).to_have_count(1)
    expect(page.locator(f'tr[data-delayed="{mine}"]')).to_be_visible()


def test_the_audit_filter_and_log_out(live_server, page, shop):
    record = fail_message(shop)
    as_operator(page, live_server.url, f"/failed/{record.pk}/")
    click(page, page.get_by_role("button", name="Archive", exact=True))
    expect(page.locator(".messages")).to_contain_text("Archive of 1 message(s) started")
    page.goto(f"{live_server.url}/audit/")
    page.get_by_label("Action").select_option("archive_failed")
    page.get_by_role("textbox", name="to").fill("9999-12-31")  # the last day there is: no upper bound
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#audit tbody tr[data-audit]")).to_have_count(
        AuditEntry.objects.filter(action="archive_failed").count())
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{live_server.url}/accounts/login/**")
    page.goto(f"{live_server.url}/audit/")
    assert "/accounts/login/" in page.url
