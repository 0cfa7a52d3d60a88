"""The queue, delayed and outbox pages' forms submitted AS THE PAGES RENDER THEM, in Chromium
(issue 20 item 4): "Delete selected" with the boxes ticked on the queue page, "Move" on a
message's page, "Deliver now" and "Delete" on /delayed/, "Dispatch now" on /outbox/; and
each of them, when it cannot do its work, says why on the page.  Setup: tests/browser_support.py."""
from __future__ import annotations

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.test_browser_dashboard import accept_dialogs, shop  # noqa: F401 — fixture
from tests.test_dashboard_pages_actions import stuck_session

from playwright.sync_api import expect  # noqa: E402

from core.delayed import delayed_store  # noqa: E402
from core.messages import Headers  # noqa: E402
from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = BROWSER_MARKS


def ready(page, button) -> None:
    """Wait until htmx has processed the button (a click before that is a plain form post)."""
    page.wait_for_function("b => !!b['htmx-internal-data']", arg=button.element_handle(), timeout=30_000)


def as_operator(page, base_url: str, path: str) -> list[str]:
    """Logged in as an operator on ``path``, every confirmation accepted (returns their texts)."""
    confirms = accept_dialogs(page)
    login(page, base_url, make_user("operator").username, path)
    return confirms


@pytest.fixture
def other_queue(shop):
    name = shop + "_b"
    create_queue(name)
    yield name
    try:
        delete_queue(name)
    finally:
        registry.forget(name)


@pytest.fixture
def delayed(shop):
    """Send a message to ``shop`` an hour from now; returns its id in the delayed store."""
    store = delayed_store()
    store.setup_infrastructure()

    def make(body: str = "later") -> str:
        mid = Transport().send(shop, body, delay=3600)
        return next(m.id for m in store.list(1000)[0] if m.headers.get(Headers.MESSAGE_ID) == mid)

    yield make
    for m in store.list(1000)[0]:
        if m.destination == shop:
            store.delete(m.id)


# -- the queue page: Delete selected --------------------------------------------------------------

def test_delete_selected_deletes_the_ticked_messages(live_server, page, shop):
    ids = Transport().send_many(shop, ["a", "b", "c"])
    net = NetworkLog(page)
    confirms = as_operator(page, live_server.url, f"/queues/{shop}/")
    page.get_by_label(f"Select {ids[0]}").check()
    page.get_by_label(f"Select {ids[2]}").check()
    button = page.get_by_role("button", name="Delete selected")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text(f"2 message(s) deleted from {shop}")
    assert [m.id for m in Transport().browse(shop)] == [ids[1]]
    assert confirms and "Delete the selected messages" in confirms[0]
    assert AuditEntry.objects.get(action="delete_messages").outcome == "ok"
    assert net.failures == []


def test_delete_selected_with_nothing_ticked_says_so(live_server, page, shop):
    Transport().send(shop, "a")
    as_operator(page, live_server.url, f"/queues/{shop}/")
    button = page.get_by_role("button", name="Delete selected")
    ready(page, button)
    button.click()
    expect(page.locator("#flash")).to_contain_text("Nothing selected")
    assert len(Transport().browse(shop)) == 1
    assert page.url == f"{live_server.url}/queues/{shop}/"


def test_delete_selected_of_messages_gone_meanwhile_says_so(live_server, page, shop):
    (mid,) = Transport().send_many(shop, ["a"])
    as_operator(page, live_server.url, f"/queues/{shop}/")
    page.get_by_label(f"Select {mid}").check()
    Transport().purge(shop)  # a worker received it while the operator looked
    button = page.get_by_role("button", name="Delete selected")
    ready(page, button)
    button.click()
    expect(page.locator("#flash")).to_contain_text("none of the 1 message(s) is in queue")


# -- a message's page: Move ------------------------------------------------------------------------

def test_move_sends_the_message_to_the_chosen_queue(live_server, page, shop, other_queue):
    mid = Transport().send(shop, {"order": 7})
    row_version = Transport().browse(shop)[0].row_version
    net = NetworkLog(page)
    as_operator(page, live_server.url, f"/queues/{shop}/messages/{row_version}/")
    page.get_by_label("Move to").select_option(other_queue)
    button = page.get_by_role("button", name="Move")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text(f"Message moved from {shop} to {other_queue}")
    assert Transport().browse(shop) == []
    (moved,) = Transport().browse(other_queue)
    assert moved.headers[Headers.MESSAGE_ID] == mid and moved.body == b'{"order":7}'
    assert net.failures == []


def test_move_of_a_message_received_meanwhile_says_so(live_server, page, shop, other_queue):
    Transport().send(shop, "a")
    row_version = Transport().browse(shop)[0].row_version
    as_operator(page, live_server.url, f"/queues/{shop}/messages/{row_version}/")
    Transport().purge(shop)
    page.get_by_label("Move to").select_option(other_queue)
    button = page.get_by_role("button", name="Move")
    ready(page, button)
    button.click()
    expect(page.locator("#flash")).to_contain_text(f"is not in queue {shop}")
    assert Transport().browse(other_queue) == []


# -- /delayed/: Deliver now, Delete ----------------------------------------------------------------

def test_deliver_now_makes_a_delayed_message_due(live_server, page, shop, delayed):
    first, second = delayed("one"), delayed("two")
    net = NetworkLog(page)
    as_operator(page, live_server.url, "/delayed/")
    row = page.locator(f'tr[data-delayed="{first}"]')
    button = row.get_by_role("button", name="Deliver now")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text("1 delayed message(s)")
    items, now = delayed_store().list(1000)
    by_id = {m.id: m for m in items}
    assert first not in by_id or by_id[first].due <= now  # due now (or already moved by a mover)
    assert by_id[second].due > now
    assert AuditEntry.objects.get(action="deliver_delayed_now").outcome == "ok"
    assert net.failures == []


def test_delete_removes_a_delayed_message(live_server, page, shop, delayed):
    first, second = delayed("one"), delayed("two")
    confirms = as_operator(page, live_server.url, "/delayed/")
    button = page.locator(f'tr[data-delayed="{first}"]').get_by_role("button", name="Delete")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text("1 delayed message(s) deleted")
    assert [m.id for m in delayed_store().list(1000)[0] if m.destination == shop] == [second]
    assert confirms and "Delete this delayed message" in confirms[0]
    expect(page.locator(f'tr[data-delayed="{first}"]')).to_have_count(0)


def test_delete_of_a_delayed_message_gone_meanwhile_says_so(live_server, page, shop, delayed):
    first = delayed()
    as_operator(page, live_server.url, "/delayed/")
    delayed_store().delete(first)  # delivered by a mover while the operator looked
    button = page.locator(f'tr[data-delayed="{first}"]').get_by_role("button", name="Delete")
    ready(page, button)
    button.click()
    expect(page.locator("#flash")).to_contain_text("is in the store")


# -- /outbox/: Dispatch now ------------------------------------------------------------------------

def test_dispatch_now_sends_a_stuck_records_messages(live_server, page, shop, outbox, monkeypatch):
    stuck_session("stuck/1", shop, monkeypatch)  # an id with "/" works from the page too
    net = NetworkLog(page)
    confirms = as_operator(page, live_server.url, "/outbox/")
    button = page.locator('tr[data-outbox="stuck/1"]').get_by_role("button", name="Dispatch now")
    ready(page, button)
    button.click()
    expect(page.locator(".messages")).to_contain_text("1 dispatched")
    assert outbox.store.state("stuck/1") == (True, False)
    assert [m.body for m in Transport().browse(shop)] == [b'x']
    assert confirms and "Dispatch this record" in confirms[0]
    expect(page.locator('tr[data-outbox="stuck/1"]')).to_have_count(0)
    assert net.failures == []


def test_dispatch_now_of_a_record_dispatched_meanwhile_says_so(live_server, page, shop, outbox, monkeypatch):
    stuck_session("stuck-2", shop, monkeypatch)
    as_operator(page, live_server.url, "/outbox/")
    outbox.dispatch(["stuck-2"])  # another process dispatched it while the operator looked
    button = page.locator('tr[data-outbox="stuck-2"]').get_by_role("button", name="Dispatch now")
    ready(page, button)
    button.click()
    expect(page.locator("#flash")).to_contain_text("none of the records is waiting")
