"""The conversation view in a real browser (headless Chromium, Playwright) against the live
server, with real pumps making the conversation and a real Celery worker running the retry:
an operator walks from a failed message to its conversation, sees the flow, timeline and
sequence, retries the failed node from there (the form as the page renders it), and after
the retry is processed the node is no longer failed.

Also writes ``docs/screenshots/conversation.png`` with ``SLUICE_SCREENSHOTS=1`` (else to a
temporary directory).  Setup: tests/browser_support.py."""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, celery_worker, login, worker_broker,
)
from tests.conftest import ROOT, drain
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core import failures  # noqa: E402
from core.delayed import DelayedMover, delayed_store  # noqa: E402
from core.models import BulkOperation, FailedMessage  # noqa: E402
from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = BROWSER_MARKS


@pytest.fixture
def shop(live_server, pump_for, temp_handlers):
    """Queues orders, billing, shipping and mail (the test's own names) and an error queue;
    PlaceOrder sends a bill, a delayed shipment and six notifications; billing fails until
    ``shop["billing_works"]`` is set; shipping sends one more notification."""
    suffix = uuid.uuid4().hex[:6]
    names = {q: f"{q}_{suffix}" for q in ("orders", "billing", "shipping", "mail")}
    create_queue("error", kind="error")
    Transport().purge("error")
    delayed_store().setup_infrastructure()
    for name in names.values():
        create_queue(name)
    state = {"billing_works": False, **names}

    def place(message, context):
        context.send(names["billing"], {"invoice": 1}, message_type="BillOrder")
        context.send(names["shipping"], {"parcel": 1}, message_type="ShipOrder", delay=0.3)
        for i in range(6):
            context.send(names["mail"], {"mail": i}, message_type="NotifyCustomer")

    def bill(message, context):
        if not state["billing_works"]:
            raise TimeoutError("payment gateway timed out")

    temp_handlers(names["orders"], None, place)
    temp_handlers(names["billing"], None, bill)
    temp_handlers(names["shipping"], None,
                  lambda m, c: c.send(names["mail"], {"shipped": 1}, message_type="OrderShipped"))
    temp_handlers(names["mail"], None, lambda m, c: None)
    state["pump"] = lambda q: drain(pump_for(names[q], immediate_retries=0, concurrency=1))
    yield state
    for name in names.values():
        try:
            delete_queue(name)
        finally:
            registry.forget(name)
    Transport().purge("error")


def _out_dir(tmp_path: Path) -> Path:
    if os.environ.get("SLUICE_SCREENSHOTS") == "1":
        out = ROOT / "docs" / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path


def test_operator_walks_from_a_failed_message_to_its_conversation_and_retries_the_node(
        live_server, page, shop, worker_broker, tmp_path):
    first = Transport().send(shop["orders"], {"order": 42}, message_type="PlaceOrder")
    shop["pump"]("orders")
    shop["pump"]("billing")
    shop["pump"]("mail")
    time.sleep(0.4)
    DelayedMover(elect=False).move_due()
    shop["pump"]("shipping")
    shop["pump"]("mail")
    assert failures.ingest_errors() == 1
    record = FailedMessage.objects.get(original_queue=shop["billing"])
    user = make_user("operator")
    net = NetworkLog(page)
    confirms: list[str] = []
    page.on("dialog", lambda d: (confirms.append(d.message), d.accept()))

    login(page, live_server.url, user.username, f"/failed/{record.pk}/")
    page.locator("a[data-conversation]").click()
    page.wait_for_url(f"{live_server.url}/conversations/{record.conversation_id}/")
    flow = page.locator("#flow")
    expect(flow.locator(f'tr[data-message="{first}"]')).to_contain_text("PlaceOrder")
    failed_row = flow.locator(f'tr[data-message="{record.message_id}"]')
    expect(failed_row).to_have_class("failed")
    expect(failed_row).to_have_attribute("data-depth", "1")
    expect(flow.locator('tr.group[data-group="NotifyCustomer"]')).to_contain_text("× 6")
    expect(page.locator("#timeline svg [data-segment=delay]")).to_have_count(1)  # the delayed shipment
    expect(page.locator(f'#sequence [data-lane="{shop["billing"]}"]')).to_have_count(1)
    page.screenshot(path=str(_out_dir(tmp_path) / "conversation.png"), full_page=True)

    button = failed_row.get_by_role("button", name="Retry")
    page.wait_for_function("b => !!b['htmx-internal-data']", arg=button.element_handle(), timeout=30_000)
    with page.expect_response(lambda r: "/failed/retry/" in r.url and r.request.method == "POST", timeout=30_000):
        button.click()
    assert confirms and "side effects may repeat" in confirms[0]
    # The action sends the page back to the conversation (HX-Redirect), with its flash message.
    expect(page.locator(".messages")).to_be_visible(timeout=30_000)
    assert page.url == f"{live_server.url}/conversations/{record.conversation_id}/"
    op = BulkOperation.objects.get()
    assert AuditEntry.objects.get(action="retry_failed").operation_id == op.pk
    deadline = time.monotonic() + 30
    while FailedMessage.objects.get(pk=record.pk).status != "retry_pending" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert FailedMessage.objects.get(pk=record.pk).status == "retry_pending"

    shop["billing_works"] = True
    shop["pump"]("billing")
    page.goto(f"{live_server.url}/conversations/{record.conversation_id}/")
    row = page.locator(f'#flow tr[data-message="{record.message_id}"]')
    expect(row).not_to_have_class("failed")
    expect(row).to_contain_text("retry")
    expect(row.get_by_role("button", name="Retry")).to_have_count(0)
    assert net.failures == []
