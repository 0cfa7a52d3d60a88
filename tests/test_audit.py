"""Every operator action writes one audit entry with its outcome, from the code that acts:
ok when it happened, rejected for bad input, denied for a viewer (nothing changed then)."""
from __future__ import annotations

import datetime as dt

import pytest

from core import failures
from core.delayed import delayed_store
from core.outbox import OutboxStore
from core.transport import Transport
from dashboard import actions
from dashboard.models import AuditEntry
from tests.dashboard_api_support import clean_broker, run_queued  # noqa: F401
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, operator, viewer  # noqa: F401


@pytest.fixture
def world(make_queue, error_queue, outbox):
    """A queue with messages, another queue, delayed messages, failed records, an outbox record."""
    store = delayed_store()
    store.setup_infrastructure()
    q, other = make_queue(), make_queue()
    t = Transport()
    ids = [t.send(q, f"m{i}") for i in range(3)]
    delayed = [t.send(q, "later", delay=3600) for _ in range(2)]
    failed = [fail_message(q) for _ in range(3)]
    archived = fail_message(q)
    failures.archive([archived.message_id])  # directly: no worker here
    OutboxStore().insert("rec-1", "[]", dispatched=False)
    yield {"q": q, "other": other, "ids": ids, "delayed": delayed, "failed": failed, "archived": archived}
    for message in store.list(10_000)[0]:
        store.delete(message.id)


def cases(w):
    """(action name, good call, bad call) for every action."""
    f = w["failed"]
    return [
        ("delete_messages", lambda u: actions.delete_messages(u, w["q"], [w["ids"][0]]),
         lambda u: actions.delete_messages(u, "no_such_queue", [w["ids"][0]])),
        ("move_message", lambda u: actions.move_message(u, w["q"], w["ids"][1], w["other"]),
         lambda u: actions.move_message(u, w["q"], w["ids"][1], "no_such_queue")),
        ("pause_queue", lambda u: actions.pause_queue(u, w["other"]),
         lambda u: actions.pause_queue(u, "no_such_queue")),
        ("resume_queue", lambda u: actions.resume_queue(u, w["other"]),
         lambda u: actions.resume_queue(u, "no_such_queue")),
        ("limit_queue", lambda u: actions.limit_queue(u, w["other"], 2, None),
         lambda u: actions.limit_queue(u, w["other"], 0, None)),
        ("send_message", lambda u: actions.send_message(u, w["other"], body='{"n": 1}'),
         lambda u: actions.send_message(u, w["other"], body="not json")),
        ("purge_queue", lambda u: actions.purge_queue(u, w["q"], w["q"]),
         lambda u: actions.purge_queue(u, w["q"], "wrong")),
        ("deliver_delayed_now", lambda u: actions.deliver_delayed_now(u, [w["delayed"][0]]),
         lambda u: actions.deliver_delayed_now(u, ["nope"])),
        ("delete_delayed", lambda u: actions.delete_delayed(u, [w["delayed"][1]]),
         lambda u: actions.delete_delayed(u, "not-a-list")),
        ("retry_failed", lambda u: actions.retry_failed(u, {"ids": [f[0].pk]}),
         lambda u: actions.retry_failed(u, {"ids": [f[0].pk], "group": "x"})),
        ("archive_failed", lambda u: actions.archive_failed(u, {"ids": [f[1].pk]}),
         lambda u: actions.archive_failed(u, {"group": "no-such-group"})),
        ("restore_failed", lambda u: actions.restore_failed(u, {"ids": [w["archived"].pk]}),
         lambda u: actions.restore_failed(u, {"ids": [f[2].pk]})),
        ("edit_and_retry", lambda u: actions.edit_and_retry(u, f[2].pk, "new body"),
         lambda u: actions.edit_and_retry(u, "x", "new body")),
        ("delete_failed", lambda u: actions.delete_failed(u, {"ids": [f[1].pk]}),
         lambda u: actions.delete_failed(u, {"all": True})),
        ("dispatch_outbox", lambda u: actions.dispatch_outbox(u, ["rec-1"]),
         lambda u: actions.dispatch_outbox(u, ["nope"])),
        ("run_pipeline", lambda u: actions.run_pipeline(u),
         lambda u: actions.run_pipeline(u, dt.datetime(2026, 11, 23, 10, 0))),  # no time zone
        *alert_cases(),
    ]


def alert_cases():
    """The Alerts page's actions, in an order where each good call leaves what the next needs."""
    from core.models.alerts import AlertRule, AlertTarget, Silence

    def target_pk():
        return AlertTarget.objects.get(name="hook").pk

    return [
        ("save_alert_target", lambda u: actions.save_alert_target(u, {"name": "hook", "url": "http://127.0.0.1:9/h"}),
         lambda u: actions.save_alert_target(u, {"name": "bad", "url": "ftp://x"})),
        ("save_alert_rule", lambda u: actions.save_alert_rule(u, {"name": "r", "kind": "queue_length",
                                                                  "targets": ["hook"]}),
         lambda u: actions.save_alert_rule(u, {"name": "r", "kind": "no_such_kind"})),
        ("test_alert_target", lambda u: actions.test_alert_target(u, target_pk()),
         lambda u: actions.test_alert_target(u, 10**9)),
        ("create_silence", lambda u: actions.create_silence(u, {"minutes": 10, "comment": "deploy"}),
         lambda u: actions.create_silence(u, {"minutes": -5})),
        ("expire_silence", lambda u: actions.expire_silence(u, Silence.objects.get().pk),
         lambda u: actions.expire_silence(u, 10**9)),
        ("import_alerts", lambda u: actions.import_alerts(u, {"rules": [{"name": "r2", "kind": "redis_down"}]}),
         lambda u: actions.import_alerts(u, {"rules": [{"name": "r3", "kind": "nope"}]})),
        ("delete_alert_rule", lambda u: actions.delete_alert_rule(u, AlertRule.objects.get(name="r").pk),
         lambda u: actions.delete_alert_rule(u, 10**9)),
        ("delete_alert_target", lambda u: actions.delete_alert_target(u, target_pk()),
         lambda u: actions.delete_alert_target(u, 10**9)),
    ]


def test_the_cases_cover_every_action(world):
    assert sorted(name for name, _, _ in cases(world)) == sorted(actions.ACTIONS)


def test_every_action_is_audited(world, operator, viewer, clean_broker):
    for name, good, bad in cases(world):
        with pytest.raises(Exception) as denied:
            good(viewer)
        assert type(denied.value).__name__ == "PermissionDenied", name
        entry = AuditEntry.objects.order_by("-pk").first()
        assert (entry.action, entry.outcome, entry.username) == (name, "denied", viewer.username)

        with pytest.raises(actions.ActionError):
            bad(operator)
        entry = AuditEntry.objects.order_by("-pk").first()
        assert (entry.action, entry.outcome) == (name, "rejected"), (name, entry.detail)
        assert entry.detail

        result = good(operator)
        entry = AuditEntry.objects.order_by("-pk").first()
        assert (entry.action, entry.outcome, entry.username) == (name, "ok", operator.username), entry.detail
        assert result.audit_id == entry.pk and entry.target
        if result.operation_id and name != "restore_failed":
            assert entry.operation_id == result.operation_id
            run_queued(result.operation_id)
    assert AuditEntry.objects.count() == 3 * len(actions.ACTIONS)


def test_targets_name_the_messages(world, operator):
    actions.delete_messages(operator, world["q"], world["ids"][:2])
    entry = AuditEntry.objects.get()
    assert entry.target_ids == world["ids"][:2]
    assert world["ids"][0] in entry.target and world["q"] in entry.target and entry.detail == "2 of 2 deleted"
