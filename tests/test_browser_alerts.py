"""The Alerts page in a real browser (headless Chromium, Playwright) against the live server,
with a real worker (thread runner) serving the alerts queue: an operator creates a target
and a rule through the forms, presses "Send test notification" and the notification
arrives at a webhook server on 127.0.0.1; a real alert then fires and arrives too.  No
page request answers 4xx/5xx, and the target's URL never shows."""
from __future__ import annotations

import pytest

from tests.alerts_support import WebhookReceiver, alerts_worker, own_alerts_queue, wait_for  # noqa: F401
from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core.alerts.evaluator import evaluate  # noqa: E402
from core.models.alerts import AlertDelivery, AlertRule, DeliveryStatus  # noqa: E402
from core.transport import Transport  # noqa: E402
from dashboard.models import AuditEntry  # noqa: E402

pytestmark = [*BROWSER_MARKS, pytest.mark.usefixtures("own_alerts_queue")]


def test_operator_creates_a_target_and_a_rule_and_the_test_notification_arrives(live_server, page, make_queue,
                                                                               settings):
    settings.SLUICE_PEEK_DELAY = 0.05
    queue = make_queue()
    user = make_user("operator")
    net = NetworkLog(page)
    with WebhookReceiver() as hook:
        host = alerts_worker()
        try:
            login(page, live_server.url, user.username, "/alerts/")
            expect(page.locator("#alerts-firing")).to_contain_text("All quiet")
            page.locator("#new-target summary").click()
            page.get_by_label("Target name").fill("alertmanager")
            page.get_by_label("Format").select_option("alertmanager")
            page.get_by_label("Webhook URL").fill(hook.url)
            page.get_by_role("button", name="Save target").click()
            row = page.locator('#alert-targets tr[data-target="alertmanager"]')
            expect(row).to_contain_text("http://127.0.0.1:")
            assert "secret-token-abc123" not in page.content()

            page.locator("#new-rule summary").click()
            page.get_by_label("Rule name").fill("orders backlog")
            page.get_by_label("Kind").select_option("queue_length")
            page.get_by_label("Threshold (N, or T seconds)").fill("0")
            page.get_by_label("Queue (* wildcards)").fill(queue)
            page.get_by_label("Clear evaluations to resolve").fill("1")
            page.get_by_role("button", name="Save rule").click()
            expect(page.locator('#alert-rules tr[data-rule="orders backlog"]')).to_contain_text(queue)

            row.get_by_role("button", name="Send test notification").click()
            expect(page.locator(".messages")).to_contain_text("Test notification to alertmanager queued")
            wait_for(lambda: hook.requests)
            first = hook.bodies()[0][0]
            assert first["labels"]["alertname"] == "SluiceTestNotification"
            wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.SENT).exists())
            page.goto(f"{live_server.url}/alerts/")
            expect(page.locator("#alert-deliveries")).to_contain_text("test")
            expect(page.locator("#alert-deliveries")).to_contain_text("sent")

            # A real alert: a message waits in the queue, the rule fires, the webhook hears it.
            Transport().send(queue, {"order": 1})
            evaluate()
            wait_for(lambda: len(hook.requests) >= 2)
            assert hook.bodies()[1][0]["labels"] == {**hook.bodies()[1][0]["labels"], "alertname": "orders backlog",
                                                     "queue": queue}
            page.goto(f"{live_server.url}/alerts/")
            expect(page.locator("#alerts-firing")).to_contain_text("orders backlog")
            # Silence it from the page: the resolution of an announced alert still goes out.
            page.locator("#alerts-firing").get_by_role("button", name="Silence 1 h").click()
            expect(page.locator("#alert-silences")).to_contain_text("orders backlog")
        finally:
            host.stop()
    assert AlertDelivery.objects.filter(status=DeliveryStatus.SENT).count() == 2
    assert AlertRule.objects.get().filters == {"queue": queue}
    assert {"save_alert_target", "save_alert_rule", "test_alert_target", "create_silence"} <= set(
        AuditEntry.objects.values_list("action", flat=True))
    assert net.failures == []
