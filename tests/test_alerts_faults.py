"""A worker process killed in the middle of sending a notification does not lose it: the
attempt was claimed (``sending``, with a deadline) and its check message committed before
the target was called, so once the deadline passes another worker sends the next attempt.
At-least-once: the target may see the notification twice (here the first request never
got its answer)."""
from __future__ import annotations

import threading

import pytest
from django.utils import timezone

from core.alerts.delivery import send_window
from core.models.alerts import AlertDelivery, AlertTarget, DeliveryStatus
from core.alerts.notify import test_notification as send_test_notification
from tests.alerts_support import WebhookReceiver, own_alerts_queue, wait_for  # noqa: F401 (a fixture)
from tests.conftest import start_worker
from tests.dashboard_pages_support import make_user

pytestmark = [pytest.mark.django_db(transaction=True)]

TIMEOUT = 2.0  # SLUICE_ALERTS_DELIVERY_TIMEOUT of the workers


def worker_env(queue: str) -> dict[str, str]:
    return {"SLUICE_ALERTS_QUEUE": queue, "SLUICE_ALERTS_DELIVERY_TIMEOUT": str(TIMEOUT),
            "SLUICE_ALERTS_RETRY_BASE": "0.2", "SLUICE_PEEK_DELAY": "0.05"}


def test_a_worker_killed_mid_send_does_not_lose_the_notification(own_alerts_queue, settings, client):
    settings.SLUICE_ALERTS_DELIVERY_TIMEOUT = TIMEOUT
    calling = threading.Event()
    # The first request hangs (the worker is killed while it waits); the second is answered.
    with WebhookReceiver([(None, {}), (200, {})], on_request=lambda body: calling.set()) as hook:
        target = AlertTarget.objects.create(name="am", url=hook.url)
        delivery = send_test_notification(target, timezone.now())
        first = start_worker("--queue", own_alerts_queue, env=worker_env(own_alerts_queue))
        try:
            assert calling.wait(30), "the first worker never called the target"
            first.kill()
            first.wait(10)
        finally:
            if first.poll() is None:
                first.kill()
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == (DeliveryStatus.SENDING, 1), "the claim was committed first"
        client.force_login(make_user("viewer"))
        row = client.get("/alerts/").content.decode()
        assert f'data-delivery="{delivery.pk}" data-status="sending"' in row and "until" in row
        second = start_worker("--queue", own_alerts_queue, env=worker_env(own_alerts_queue))
        try:
            wait_for(lambda: AlertDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENT).exists(),
                     timeout=send_window() + 30, what="the notification to arrive after the kill")
        finally:
            second.terminate()
            second.wait(30)
    delivery.refresh_from_db()
    assert delivery.attempts == 2, "the lost attempt counts as one; the next one was sent"
    assert len(hook.requests) == 2
    assert [b[0]["labels"]["alertname"] for b in hook.bodies()] == ["SluiceTestNotification"] * 2
