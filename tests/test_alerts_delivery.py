"""Notifications reach real receivers through Sluice's own queue: a webhook server that
answers 500, 429 with Retry-After, then 200; an SMTP server (aiosmtpd); a target that never
answers fails for good, shows as failed and raises the delivery_failed self-health alert.
Secrets never reach the delivery rows or the logs."""
from __future__ import annotations

import json
import logging
import sqlite3
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from core.monitoring.measurements import queue_levels

from core.alerts.delivery import CHECK_TYPE
from core.alerts.evaluator import evaluate
from core.alerts.notify import MESSAGE_TYPE
from core.models.alerts import AlertDelivery, AlertRule, AlertTarget, DeliveryStatus, RuleKind, TargetFormat
from core.alerts.notify import test_notification as send_test_notification
from core.scheduling import delayed_store
from core.transport import Transport
from tests.alerts_support import (  # noqa: F401 (a fixture)
    SmtpReceiver,
    WebhookReceiver,
    alerts_worker,
    free_port,
    own_alerts_queue,
    served_until,
    wait_for,
)
from tests.conftest import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_alerts_queue")]


@pytest.fixture
def fast_retries(settings):
    settings.SLUICE_ALERTS_RETRY_BASE = 0.2
    settings.SLUICE_ALERTS_RETRY_CAP = 3.0
    settings.SLUICE_ALERTS_DELIVERY_TIMEOUT = 2.0
    settings.SLUICE_ALERTS_DELIVERY_ATTEMPTS = 4
    settings.SLUICE_PEEK_DELAY = 0.05


def _queue_rule(queue: str, **fields) -> AlertRule:
    return AlertRule.objects.create(name=fields.pop("name", "backlog"), kind=RuleKind.QUEUE_LENGTH,
                                    threshold=fields.pop("threshold", 1), filters={"queue": queue},
                                    clear_after=fields.pop("clear_after", 1), **fields)


def test_webhook_retries_500_then_honours_retry_after_on_429_then_delivers(queue, fast_retries, caplog):
    script = [(500, {}), (429, {"Retry-After": "1"}), (200, {})]
    with WebhookReceiver(script) as hook:
        target = AlertTarget.objects.create(name="am", format=TargetFormat.ALERTMANAGER, url=hook.url,
                                            headers={"Authorization": "Bearer very-secret-header"})
        _queue_rule(queue)
        Transport().send_many(queue, [{"n": i} for i in range(3)])
        caplog.set_level(logging.INFO, logger="sluice")
        assert evaluate().notifications == 1
        host = alerts_worker()
        try:
            delivery = wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.SENT).first())
        finally:
            host.stop()
    assert delivery.attempts == 3 and delivery.target == target
    # A success clears the earlier attempts' error and ends the delivery.
    assert delivery.last_error == "" and delivery.finished_at is not None and delivery.sending_until is None
    assert f"firing notification #{delivery.pk} to am sent (attempt 3)" in caplog.text
    times = [r[0] for r in hook.requests]
    assert len(times) == 3
    assert times[2] - times[1] >= 0.95, "Retry-After: 1 was not honoured"
    alert = hook.bodies()[-1][0]
    assert alert["labels"]["alertname"] == "backlog" and alert["labels"]["queue"] == queue
    assert "endsAt" not in alert and alert["annotations"]["dedup_key"]
    assert hook.requests[-1][2]["Authorization"] == "Bearer very-secret-header"
    logs = caplog.text
    assert "secret-token-abc123" not in logs and "very-secret-header" not in logs
    assert "attempt 1 failed" in logs


@pytest.mark.parametrize("mode", [
    "sends_atomic_with_receive",
    # Its receive runs on a second alias of the same database.
    pytest.param("receive_only", marks=pytest.mark.django_db(transaction=True, databases="__all__")),
    "outbox"])
def test_the_target_is_called_with_no_transaction_open(mode, own_alerts_queue, fast_retries, settings, request):
    """While the webhook request is open, another connection sees the claim committed, the
    received message gone from the queue, and nothing locked: on PostgreSQL the delivery's
    row can be locked at once (NOWAIT); on SQLite another connection can start writing.
    In every transaction mode (receive_only receives on a connection of its own)."""
    if mode == "receive_only" and connection.vendor == "sqlite":
        pytest.skip("receive_only needs concurrent writers (refused on SQLite)")
    if mode == "outbox":
        request.getfixturevalue("outbox")
    settings.SLUICE_TRANSACTION_MODE = mode
    seen: list[dict] = []

    def look(body) -> None:
        try:
            view = {"status": AlertDelivery.objects.get().status,
                    "waiting": queue_levels([own_alerts_queue])[0].pending}
            if connection.vendor == "postgresql":
                with transaction.atomic():
                    view["locked_at_once"] = len(AlertDelivery.objects.select_for_update(nowait=True).all()) == 1
            else:
                view["write_lock_free"] = _sqlite_write_lock_free(connection.settings_dict["NAME"])
            seen.append(view)
        except DatabaseError as exc:
            seen.append({"error": str(exc)})
        finally:
            connection.close()  # this is the webhook server's thread

    with WebhookReceiver(on_request=look) as hook:
        target = AlertTarget.objects.create(name="am", url=hook.url)
        send_test_notification(target, timezone.now())
        host = alerts_worker()
        try:
            wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.SENT).exists())
        finally:
            host.stop()
    assert len(seen) == 1
    assert seen[0]["status"] == DeliveryStatus.SENDING, seen
    # receive_only: the call follows the claim's own commit, not the receive's (which may
    # still be open on its connection: see the test below), so the row may still be seen.
    assert seen[0]["waiting"] == 0 or mode == "receive_only", seen
    assert seen[0].get("locked_at_once") or seen[0].get("write_lock_free"), seen


def _sqlite_write_lock_free(path: str, within: float = 3.0) -> bool:
    """Whether another connection can take SQLite's write lock within a few seconds (the
    worker's other loops write now and then; a receive transaction held across the call
    would hold it the whole time)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            time.sleep(0.05)
        finally:
            other.close()
    return False


def test_email_reaches_a_real_smtp_server(queue, fast_retries, settings):
    with SmtpReceiver() as smtp:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp.port
        settings.DEFAULT_FROM_EMAIL = "sluice@example.test"
        AlertTarget.objects.create(name="oncall", format=TargetFormat.EMAIL, recipients="ops@example.test, b@example.test")
        _queue_rule(queue)
        Transport().send_many(queue, [{"n": i} for i in range(2)])
        evaluate()
        host = alerts_worker()
        try:
            wait_for(lambda: smtp.messages)
        finally:
            host.stop()
    sender, rcpts, content = smtp.messages[0]
    assert rcpts == ["ops@example.test", "b@example.test"]
    assert "[FIRING] backlog" in content and queue in content


def test_a_target_that_never_answers_fails_for_good_and_raises_a_self_health_alert(queue, fast_retries, settings):
    settings.SLUICE_ALERTS_DELIVERY_ATTEMPTS = 2
    dead = f"http://127.0.0.1:{free_port()}/hook/secret-token-xyz987"  # nothing listens
    AlertTarget.objects.create(name="dead", url=dead)
    _queue_rule(queue)
    AlertRule.objects.create(name="deliveries", kind=RuleKind.DELIVERY_FAILED, window_seconds=4, clear_after=1)
    Transport().send(queue, {"n": 1})
    Transport().send(queue, {"n": 2})
    evaluate()
    host = alerts_worker()
    try:
        failed = wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.FAILED).first())
    finally:
        host.stop()
    assert failed.attempts == 2 and "network error" in failed.last_error
    assert "secret-token-xyz987" not in failed.last_error
    evaluate()
    rule = AlertRule.objects.get(name="deliveries")
    assert rule.alerts.get().labels["target"] == "dead"
    # Once the failure is older than the rule's window, the alert resolves.
    wait_for(lambda: evaluate() is not None and rule.alerts.get().state == "resolved", timeout=15, interval=0.5)


def test_slack_teams_and_pagerduty_templates(queue, fast_retries):
    with WebhookReceiver() as hook:
        for fmt in (TargetFormat.SLACK, TargetFormat.TEAMS, TargetFormat.PAGERDUTY):
            AlertTarget.objects.create(name=fmt, format=fmt, url=hook.url, routing_key="rk-secret-1234")
        rule = _queue_rule(queue)
        Transport().send_many(queue, [{"n": i} for i in range(3)])
        evaluate()
        Transport().purge(queue)
        evaluate()  # clear_after=1: resolved, with the same dedup key
        host = alerts_worker()
        try:
            wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.SENT).count() == 6)
        finally:
            host.stop()
    bodies = hook.bodies()
    slack = [b for b in bodies if "text" in b]
    teams = [b for b in bodies if b.get("type") == "message"]
    pd = [b for b in bodies if "routing_key" in b]
    assert len(slack) == len(teams) == len(pd) == 2
    assert any("[FIRING] backlog" in b["text"] for b in slack) and any("[RESOLVED]" in b["text"] for b in slack)
    assert teams[0]["attachments"][0]["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert sorted(b["event_action"] for b in pd) == ["resolve", "trigger"]
    assert pd[0]["dedup_key"] == pd[1]["dedup_key"] == rule.alerts.get().fingerprint


def test_the_rate_limit_per_target_records_what_it_held_back(make_queue, fast_retries):
    target = AlertTarget.objects.create(name="limited", url="http://127.0.0.1:9/x", max_per_hour=2)
    queues = [make_queue() for _ in range(3)]
    AlertRule.objects.create(name="any", kind=RuleKind.QUEUE_LENGTH, threshold=0, filters={"queue": "q_*"})
    for q in queues:
        Transport().send(q, {"n": 1})
    evaluate()
    statuses = sorted(AlertDelivery.objects.filter(target=target).values_list("status", flat=True))
    assert statuses.count(DeliveryStatus.RATE_LIMITED) == 1 and len(statuses) == 3
    # A test notification is never held back.
    assert send_test_notification(target, timezone.now()).status == DeliveryStatus.PENDING


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases="__all__")
def test_in_receive_only_mode_a_receive_rolled_back_after_the_claim_does_not_lose_the_attempt(
        own_alerts_queue, fast_retries, temp_handlers, pump_for):
    """receive_only: the claim commits on the handler's connection, apart from the receive.
    When the receive then rolls back (its connection lost, here killed by the next message's
    handler), the attempt is claimed already — the message, received again, is a copy of it —
    so the call must not wait for the receive's commit: it is made once, and the attempt is
    not counted as lost without a call."""
    from django.db import connections

    from core.alerts.delivery import register

    register()
    pump = pump_for(own_alerts_queue, transaction_mode="receive_only", concurrency=1, receive_batch_size=10)
    killed: list[int] = []

    def kill_the_receive(message, context) -> None:
        if not killed:  # once: the batch received again goes through
            pid = connections[pump.receive_alias].connection.info.backend_pid
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            killed.append(pid)

    temp_handlers(own_alerts_queue, "Kill", kill_the_receive)
    with WebhookReceiver() as hook:
        target = AlertTarget.objects.create(name="am", url=hook.url)
        send_test_notification(target, timezone.now())
        Transport().send(own_alerts_queue, {"kill": 1}, message_type="Kill")

        with pytest.raises(DatabaseError):
            pump.receive_and_process(10)  # claimed and committed, then the receive is lost
        connections[pump.receive_alias].close()
        pump.receive_and_process(10)  # received again: a copy of the claimed attempt

        delivery = wait_for(lambda: AlertDelivery.objects.filter(status=DeliveryStatus.SENT).first(), timeout=5)
    assert killed and len(hook.requests) == 1
    assert delivery.attempts == 1 and delivery.last_error == ""


# -- an attempt's check: what happens when its deadline comes --------------------------------
def _attempt_under_way(target: AlertTarget, n: int, deadline_in: float) -> AlertDelivery:
    """Attempt ``n`` claimed (``sending``) with its deadline ``deadline_in`` seconds from now
    (negative: passed) and no call that will settle it: its worker was killed after the claim."""
    return AlertDelivery.objects.create(target=target, event="test", status=DeliveryStatus.SENDING, attempts=n,
                                        sending_until=timezone.now() + timedelta(seconds=deadline_in))


def _check_comes_due(queue: str, delivery: AlertDelivery, n: int, pump_for) -> None:
    """Attempt ``n``'s check message, as the claim sent it, received by the alerts queue's pump."""
    from core.alerts.delivery import register
    from core.queues import create_queue

    register()
    create_queue(queue)
    Transport().send(queue, {"delivery": delivery.pk, "attempt": n, "check": True}, message_type=CHECK_TYPE)
    drain(pump_for(queue))


def _delayed_for(queue: str) -> list[tuple[str | None, dict, float]]:
    """What waits in the delayed store for ``queue``: (message type, body, seconds until due)."""
    stored, now = delayed_store().list(1000)
    return [(m.message_type, json.loads(m.body), (m.due - now).total_seconds()) for m in stored
            if m.destination == queue]


LOST = "attempt {n} had no result by its deadline: the worker making it stopped or lost the database"


def test_an_attempt_with_no_result_by_its_deadline_counts_as_lost_and_the_next_goes_out(
        own_alerts_queue, fast_retries, pump_for, caplog):
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = _attempt_under_way(target, 1, deadline_in=-1)
    with caplog.at_level(logging.INFO, logger="sluice.alerts"):
        _check_comes_due(own_alerts_queue, delivery, 1, pump_for)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.sending_until) == (DeliveryStatus.RETRYING, 1, None)
    assert delivery.last_error == LOST.format(n=1)
    [(kind, body, due_in)] = _delayed_for(own_alerts_queue)
    assert (kind, body) == (MESSAGE_TYPE, {"delivery": delivery.pk, "attempt": 2})
    assert 0 <= due_in <= 3.0  # fast_retries: the retry cap
    [logged] = [r for r in caplog.records if r.name == "sluice.alerts"]
    assert logged.levelname == "WARNING"
    assert logged.getMessage().startswith(
        f"test notification #{delivery.pk} to am: attempt 1 failed ({LOST.format(n=1)}); next in ")


def test_a_lost_last_attempt_fails_for_good(own_alerts_queue, fast_retries, pump_for, caplog):
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = _attempt_under_way(target, 4, deadline_in=-1)  # fast_retries: 4 attempts
    with caplog.at_level(logging.INFO, logger="sluice.alerts"):
        _check_comes_due(own_alerts_queue, delivery, 4, pump_for)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.sending_until) == (DeliveryStatus.FAILED, None)
    assert delivery.finished_at is not None and delivery.last_error == LOST.format(n=4)
    assert _delayed_for(own_alerts_queue) == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sluice.alerts"] == [
        ("ERROR", f"test notification #{delivery.pk} to am failed for good after 4 attempt(s): {LOST.format(n=4)}")]


def test_a_check_before_a_rearmed_deadline_looks_again_then(own_alerts_queue, fast_retries, pump_for):
    """The call re-armed the deadline (it waited for a free sending thread): the attempt is
    still under way, so the check settles nothing and comes again half a second after the new
    deadline.  Another notification's lapsed attempt 1 is not this check's to settle."""
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = _attempt_under_way(target, 1, deadline_in=5)
    bystander = _attempt_under_way(target, 1, deadline_in=-1)
    _check_comes_due(own_alerts_queue, delivery, 1, pump_for)
    delivery.refresh_from_db()
    bystander.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.SENDING, 1, "")
    assert (bystander.status, bystander.last_error) == (DeliveryStatus.SENDING, "")
    [(kind, body, due_in)] = _delayed_for(own_alerts_queue)
    assert (kind, body) == (CHECK_TYPE, {"delivery": delivery.pk, "attempt": 1, "check": True})
    assert 4.5 < due_in <= 5.5


@pytest.mark.parametrize("status, attempts", [(DeliveryStatus.SENT, 1), (DeliveryStatus.SENDING, 2)],
                         ids=["settled", "a-later-attempt-began"])
def test_a_check_of_an_attempt_that_is_over_changes_nothing(status, attempts, own_alerts_queue, fast_retries,
                                                            pump_for):
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = _attempt_under_way(target, attempts, deadline_in=-1)
    AlertDelivery.objects.filter(pk=delivery.pk).update(status=status)
    _check_comes_due(own_alerts_queue, delivery, 1, pump_for)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (status, attempts, "")
    assert _delayed_for(own_alerts_queue) == []



def test_a_target_the_http_client_refuses_fails_for_good_at_once_with_its_error(own_alerts_queue, fast_retries):
    """An address urllib will not even try (no scheme): that target's failure, for good,
    after one attempt, with the error named; not retried, not a crash of the sender."""
    target = AlertTarget.objects.create(name="typo", url="hooks.example.invalid/alert")
    send_test_notification(target, timezone.now())
    delivery = served_until(DeliveryStatus.FAILED)
    assert delivery.attempts == 1 and delivery.sending_until is None
    # (the address is redacted: a webhook URL may carry a token)
    assert delivery.last_error == "ValueError: unknown url type: '[secret]'"


def test_the_claim_alone_sets_the_attempts_deadline_and_its_check(own_alerts_queue, fast_retries, pump_for,
                                                                  monkeypatch):
    """A worker that dies after the claim committed, before its call: the claim's own
    deadline (now + the send window) and the check message due then are what let the
    attempt be counted as lost."""
    from core.alerts import delivery as delivery_module
    from core.alerts.delivery import register, send_window

    monkeypatch.setattr(delivery_module, "call", lambda pk, n: None)  # the worker dies before calling
    register()
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    send_test_notification(target, timezone.now())
    claimed_at = timezone.now()
    drain(pump_for(own_alerts_queue))
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.SENDING, 1)
    window = send_window()
    assert window == 3 * 2.0 + 2.0  # fast_retries: a 2 s timeout per step of a call
    assert abs((delivery.sending_until - claimed_at).total_seconds() - window) < 1.0
    [(kind, body, due_in)] = _delayed_for(own_alerts_queue)
    assert (kind, body) == (CHECK_TYPE, {"delivery": delivery.pk, "attempt": 1, "check": True})
    assert window - 1.0 < due_in <= window


def test_a_copy_of_an_attempt_already_claimed_is_not_claimed_again(own_alerts_queue, fast_retries, pump_for,
                                                                   monkeypatch):
    """The same attempt's message twice (a receive that rolled back after the claim
    committed, in receive_only; or a producer's retry): one claim, one call."""
    from core.alerts import delivery as delivery_module
    from core.alerts.delivery import register

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(delivery_module, "call", lambda pk, n: calls.append((pk, n)))
    register()
    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = send_test_notification(target, timezone.now())
    Transport().send(own_alerts_queue, {"delivery": delivery.pk, "attempt": 1}, message_type=MESSAGE_TYPE)
    drain(pump_for(own_alerts_queue))
    wait_for(lambda: calls, timeout=5)
    time.sleep(0.2)  # (a second call would be on its way by now)
    assert calls == [(delivery.pk, 1)]
    assert AlertDelivery.objects.get().attempts == 1


def test_a_target_is_never_called_inside_a_transaction():
    """The guard before every call: it names the alias whose transaction is open."""
    from django.db.transaction import TransactionManagementError

    from core.alerts.delivery import no_transaction_open

    no_transaction_open()
    with transaction.atomic(), pytest.raises(TransactionManagementError, match=r"open on \['default'\]"):
        no_transaction_open()


# -- late and lost results of a call ---------------------------------------------------------------
def test_a_late_failure_of_an_earlier_attempt_does_not_settle_the_later_one_but_a_late_success_counts(
        own_alerts_queue, fast_retries):
    from core.alerts.delivery import settle
    from core.alerts.sending import Attempt

    target = AlertTarget.objects.create(name="am", url="http://127.0.0.1:9/never-called")
    delivery = _attempt_under_way(target, 2, deadline_in=5)  # attempt 1 was counted as lost
    settle(delivery, 1, Attempt(False, True, None, "HTTP 503: busy"), Transport())
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == (DeliveryStatus.SENDING, 2, "")
    assert _delayed_for(own_alerts_queue) == []
    settle(delivery, 1, Attempt(True), Transport())  # the notification reached its target after all
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.SENT


def test_a_call_for_an_attempt_no_longer_under_way_calls_nobody(own_alerts_queue, fast_retries):
    """The call waited for a free sending thread past its deadline: its check counted it as
    lost and the next attempt began, so this call makes no request."""
    from core.alerts.delivery import call

    with WebhookReceiver() as hook:
        target = AlertTarget.objects.create(name="am", url=hook.url)
        delivery = _attempt_under_way(target, 2, deadline_in=5)
        call(delivery.pk, 1)
    assert hook.requests == []
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.SENDING, 2)


def test_a_call_whose_result_cannot_be_stored_logs_it_and_leaves_the_attempt_to_its_check(
        own_alerts_queue, fast_retries, monkeypatch, caplog):
    from core.alerts import delivery as delivery_module

    def database_gone(*args, **kwargs):
        raise DatabaseError("server closed the connection unexpectedly")

    monkeypatch.setattr(delivery_module, "settle", database_gone)
    with WebhookReceiver() as hook:
        target = AlertTarget.objects.create(name="am", url=hook.url)
        delivery = _attempt_under_way(target, 1, deadline_in=5)
        with caplog.at_level(logging.ERROR, logger="sluice.alerts"):
            delivery_module.call(delivery.pk, 1)
    assert len(hook.requests) == 1
    [logged] = [r for r in caplog.records if r.name == "sluice.alerts"]
    assert logged.getMessage() == f"alert delivery #{delivery.pk}, attempt 1: not settled; its check will"
    assert logged.exc_info and "server closed the connection" in str(logged.exc_info[1])
    delivery.refresh_from_db()
    assert delivery.status == DeliveryStatus.SENDING  # its check message will settle it as lost
