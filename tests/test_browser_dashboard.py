"""The failed-message workflows in a real browser (headless Chromium, Playwright) against the
live server, with a real Celery worker running the bulk operations: log in, see a group, retry
it and watch the progress bar finish, edit and retry, archive and restore, a viewer denied;
and no page answers a request of its own with 4xx/5xx.  Setup: tests/browser_support.py."""
from __future__ import annotations

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, celery_worker, login, worker_broker,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core.delayed import delayed_store  # noqa: E402
from core.models import BulkOperation, FailedMessage  # noqa: E402
from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = BROWSER_MARKS


@pytest.fixture
def shop(live_server):
    """Queues ``error`` and one of the test's own, dropped at teardown (before the flush)."""
    import uuid

    name = f"shop_{uuid.uuid4().hex[:8]}"
    create_queue("error", kind="error")
    create_queue(name)
    Transport().purge("error")
    yield name
    for queue in (name,):
        try:
            delete_queue(queue)
        finally:
            registry.forget(queue)
    Transport().purge("error")


def accept_dialogs(page) -> list[str]:
    """Accept htmx's confirmations (hx-confirm uses window.confirm); returns their texts."""
    texts: list[str] = []

    def handle(dialog) -> None:
        texts.append(dialog.message)
        dialog.accept()

    page.on("dialog", handle)
    return texts


def test_operator_retries_a_group_and_watches_the_progress_bar_finish(live_server, page, shop, worker_broker):
    group = [fail_message(shop, exception_type="TimeoutError", frame="charge") for _ in range(25)]
    fail_message(shop, exception_type="KeyError", frame="other")
    user = make_user("operator")
    net = NetworkLog(page)
    confirms = accept_dialogs(page)

    login(page, live_server.url, user.username, "/failed/")
    row = page.locator(f'#groups tr[data-group="{group[0].group_key}"]')
    expect(row).to_contain_text("TimeoutError @ shop/handlers.py:charge")
    expect(row).to_contain_text("25")

    button = row.get_by_role("button", name="Retry group")
    # Under load a click can land before htmx has processed the button; wait until it has
    # (htmx keeps its state on the element), so the click is the htmx action it tests.
    page.wait_for_function("b => !!b['htmx-internal-data']", arg=button.element_handle(), timeout=30_000)
    # Wait for the action's own request, not for a poll of the progress region: when the
    # worker finishes the 25 before the page reloads, that page has nothing left to poll.
    # 30 s: make test runs its pytest processes at once on two cores, browsers included.
    with page.expect_response(lambda r: "/failed/retry/" in r.url and r.request.method == "POST",
                              timeout=30_000):
        button.click()
    assert confirms and "25 message(s)" in confirms[0]
    op = BulkOperation.objects.get()
    bar = page.locator(f'#operations [data-operation="{op.pk}"]')
    expect(bar).to_have_attribute("data-status", "finished", timeout=30_000)
    expect(bar.locator(".progress")).to_have_attribute("aria-valuenow", "25")
    expect(bar).to_contain_text("25 done of 25 (100%)")
    # Done: the region stops polling (no trigger on the last fragment).
    expect(page.locator("#operations")).to_have_attribute("data-running", "false")
    assert len(Transport().browse(shop, limit=100)) == 25
    assert FailedMessage.objects.filter(status="retry_pending").count() == 25
    assert FailedMessage.objects.filter(status="unresolved").count() == 1
    assert AuditEntry.objects.get(action="retry_failed").operation_id == op.pk
    assert net.failures == []


def test_operator_edits_and_retries_a_message(live_server, page, shop):
    record = fail_message(shop, body='{"sku": "BAD"}', headers={"Tenant": "acme"})
    user = make_user("operator")
    net = NetworkLog(page)
    login(page, live_server.url, user.username, f"/failed/{record.pk}/")
    expect(page.locator("[data-trace]")).to_contain_text("Traceback")
    page.get_by_role("link", name="Edit and retry…").click()
    expect(page.locator("#edit-headers tr.locked")).not_to_have_count(0)
    page.get_by_label("Body").fill('{"sku": "A-1"}')
    page.get_by_label("Value of Tenant").fill("globex")
    page.get_by_role("button", name="Send the edited copy").click()
    page.wait_for_url(f"{live_server.url}/failed/{record.pk}/")
    expect(page.locator(".messages")).to_contain_text("Edited copy sent")
    expect(page.locator("table.kv").first).to_contain_text("resolved")
    (copy,) = Transport().browse(shop)
    assert copy.body == b'{"sku": "A-1"}' and copy.headers["Tenant"] == "globex"
    assert net.failures == []


def test_operator_archives_and_restores(live_server, page, shop, worker_broker):
    keep, archive_me = fail_message(shop), fail_message(shop)
    user = make_user("operator")
    net = NetworkLog(page)
    accept_dialogs(page)
    login(page, live_server.url, user.username, "/failed/")
    page.get_by_label(f"Select {archive_me.message_id}").check()
    page.get_by_role("button", name="Archive selected").click()
    op_row = page.locator("#operations [data-operation]").first
    expect(op_row).to_have_attribute("data-status", "finished", timeout=30_000)
    assert FailedMessage.objects.get(pk=archive_me.pk).status == "archived"
    assert FailedMessage.objects.get(pk=keep.pk).status == "unresolved"

    page.goto(f"{live_server.url}/failed/?status=archived")
    expect(page.locator("#failures tbody tr[data-failed]")).to_have_count(1)
    page.get_by_label(f"Select {archive_me.message_id}").check()
    page.get_by_role("button", name="Restore selected").click()
    expect(page.locator(".messages")).to_contain_text("Restore of 1 message(s) started")
    op_row = page.locator("#operations [data-operation]").first  # a worker restores (issue 20 item 3)
    expect(op_row).to_contain_text("restore")
    expect(op_row).to_have_attribute("data-status", "finished", timeout=30_000)
    assert FailedMessage.objects.get(pk=archive_me.pk).status == "unresolved"
    assert net.failures == []


def test_a_viewer_sees_disabled_actions_and_a_forged_request_changes_nothing(live_server, page, shop):
    record = fail_message(shop)
    user = make_user("viewer")
    login(page, live_server.url, user.username, "/failed/")
    button = page.locator(f'#groups tr[data-group="{record.group_key}"]').get_by_role("button", name="Retry group")
    expect(button).to_be_disabled()
    expect(button).to_have_attribute("title", "Your role is sluice-viewer: only sluice-operator users can act.")
    expect(page.locator('[data-role="viewer"]')).to_be_visible()

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(f"{live_server.url}/failed/retry/", form={"group": record.group_key},
                                 headers={"X-CSRFToken": token, "Referer": f"{live_server.url}/failed/"})
    assert response.status == 403 and "Only operators" in response.text()
    assert not BulkOperation.objects.exists()
    assert FailedMessage.objects.get(pk=record.pk).status == "unresolved"
    assert AuditEntry.objects.get(action="retry_failed").outcome == "denied"


def test_no_page_fails_a_request(live_server, page, shop, settings):
    delayed_store().setup_infrastructure()
    transport = Transport()
    transport.send(shop, {"order": 1}, message_type="PlaceOrder")
    transport.send(shop, "later", delay=900)
    record = fail_message(shop)
    row_version = transport.browse(shop)[0].row_version
    user = make_user("operator")
    net = NetworkLog(page)
    login(page, live_server.url, user.username)
    try:
        for path in ("/", "/failed/", "/failed/?by=queue", f"/failed/{record.pk}/", f"/failed/{record.pk}/edit/",
                     f"/queues/{shop}/", f"/queues/{shop}/messages/{row_version}/", "/delayed/", "/outbox/",
                     "/audit/"):
            response = page.goto(live_server.url + path)
            assert response is not None and response.status == 200, path
            page.wait_for_load_state("networkidle")
            expect(page.locator("h1")).to_be_visible()
    finally:
        store = delayed_store()
        for m in store.list(1000)[0]:
            if m.destination == shop:
                store.delete(m.id)
    assert net.failures == []


def test_a_refused_action_shows_its_reason_on_the_page(live_server, page, shop):
    fail_message(shop)
    user = make_user("operator")
    login(page, live_server.url, user.username, "/failed/")
    page.on("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Archive selected").click()  # nothing ticked
    expect(page.locator("#flash")).to_contain_text("Nothing selected: tick messages first")
    assert page.url == f"{live_server.url}/failed/"  # stayed on the page


def test_select_all_and_shift_click_ranges(live_server, page, shop):
    records = [fail_message(shop) for _ in range(5)]
    user = make_user("viewer")
    login(page, live_server.url, user.username, "/failed/")
    boxes = page.locator('#failures input[name="ids"]')
    expect(boxes).to_have_count(5)
    page.get_by_label("Select all on this page").check()
    assert all(boxes.nth(i).is_checked() for i in range(5))
    page.get_by_label("Select all on this page").uncheck()
    boxes.nth(1).click()
    boxes.nth(3).click(modifiers=["Shift"])
    assert [boxes.nth(i).is_checked() for i in range(5)] == [False, True, True, True, False]
    assert len(records) == 5
