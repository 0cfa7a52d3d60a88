"""dashboard.actions called directly (the path the pages and the API share): the role check,
input checks, the outbox and move actions, and bulk operations handed to a real Celery
worker (or failing visibly when the broker is down)."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from core.models import BulkOperation, FailedMessage, FailureStatus
from core.outbox import OutboxSession, OutboxStore
from core.transport import Transport
from dashboard import actions
from dashboard.actions.operations import BULK_TASK, TASK_QUEUE
from dashboard.models import AuditEntry
from dashboard.security.permissions import can_act, can_view
from tests.dashboard_api_support import clean_broker, queued_operations  # noqa: F401
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user, operator, viewer  # noqa: F401


def test_roles(transactional_db):
    from django.contrib.auth.models import AnonymousUser, User

    admin = User.objects.create_superuser("root_user", password="x")
    nobody, viewer, operator = make_user(None), make_user("viewer"), make_user("operator")
    assert [can_view(u) for u in (AnonymousUser(), nobody, viewer, operator, admin)] == [False, False, True, True, True]
    assert [can_act(u) for u in (AnonymousUser(), nobody, viewer, operator, admin)] == [False, False, False, True, True]
    operator.is_active = False
    assert not can_view(operator)


def test_a_viewer_is_refused_and_the_refusal_audited(viewer, queue):
    mid = Transport().send(queue, "x")
    with pytest.raises(PermissionDenied):
        actions.delete_messages(viewer, queue, [mid], via="web")
    assert [m.id for m in Transport().browse(queue)] == [mid]
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.action, entry.outcome, entry.via) == (viewer.username, "delete_messages", "denied", "web")


@pytest.mark.parametrize("ids,text", [
    ("abc", "must be a list"), ([], "no message ids"), ([""], "malformed id"), ([7], "malformed id"),
    (["a\nb"], "malformed id"), (["x"] * 10_001, "at most"),
])
def test_malformed_ids(operator, queue, ids, text):
    with pytest.raises(actions.ActionError) as err:
        actions.delete_messages(operator, queue, ids)
    assert text in err.value.message and err.value.status == 400


def test_move_refuses_the_same_queue_and_missing_messages(operator, make_queue):
    a, b = make_queue(), make_queue()
    with pytest.raises(actions.ActionError, match="already in that queue"):
        actions.move_message(operator, a, "x", a)
    with pytest.raises(actions.ActionError) as err:
        actions.move_message(operator, a, "0c8f9bd4-7a4e-4c55-9f5d-6a0b0d4e3a11", b)
    assert err.value.status == 404


def test_dispatch_outbox_now(operator, outbox, make_queue):
    target = make_queue()
    with OutboxSession("outbox-rec-1") as session:
        session.send(target, "from the outbox")
    store = OutboxStore()
    assert store.state("outbox-rec-1") is not None
    if store.state("outbox-rec-1")[0]:  # already dispatched after the commit: dispatch-now has nothing to do
        with pytest.raises(actions.ActionError) as err:
            actions.dispatch_outbox(operator, ["outbox-rec-1"])
        assert err.value.status == 409
        return
    result = actions.dispatch_outbox(operator, ["outbox-rec-1"])
    assert result.count == 1 and [m.body for m in Transport().browse(target)] == [b"from the outbox"]


def test_dispatch_outbox_refuses_unknown_records(operator, outbox):
    with pytest.raises(actions.ActionError) as err:
        actions.dispatch_outbox(operator, ["no-such-record"])
    assert err.value.status == 404 and AuditEntry.objects.get().outcome == "rejected"


def test_the_producer_sends_to_the_queue_the_workers_consume():
    from workers.celery import app

    assert app.conf.task_default_queue == TASK_QUEUE
    assert BULK_TASK in app.tasks


def test_an_empty_selection_starts_nothing(operator, queue, error_queue):
    record = fail_message(queue)
    FailedMessage.objects.filter(pk=record.pk).update(status=FailureStatus.RESOLVED)
    with pytest.raises(actions.ActionError) as err:
        actions.retry_failed(operator, {"ids": [record.pk]})
    assert err.value.status == 409 and not BulkOperation.objects.exists()


@pytest.mark.timeout(180)
def test_a_real_worker_runs_the_retry(operator, queue, error_queue, clean_broker, tmp_path, settings):
    """The operation reaches a Celery worker (tasks only) through Redis and finishes."""
    from types import SimpleNamespace

    from tests.celery_support import CeleryCluster
    from tests.conftest import wait_for

    record = fail_message(queue)
    result = actions.retry_failed(operator, {"ids": [record.pk]}, via="web")
    assert queued_operations() == [result.operation_id]
    cluster = CeleryCluster(SimpleNamespace(url=settings.REDIS_URL), tmp_path)
    try:
        cluster.worker({"SLUICE_CELERY_HOST_LOOPS": "0"})
        wait_for(lambda: BulkOperation.objects.get(pk=result.operation_id).status == "finished", timeout=60,
                 what="the worker to finish the retry")
    finally:
        cluster.stop_all()
    assert [m.id for m in Transport().browse(queue)] == [record.message_id]


def test_edit_and_retry_when_the_queue_is_gone(operator, make_queue, error_queue):
    from core.queues import delete_queue

    name = make_queue()
    record = fail_message(name)
    delete_queue(name)
    with pytest.raises(actions.ActionError) as err:
        actions.edit_and_retry(operator, record.pk, "fixed")
    assert err.value.status == 409 and "no longer exists" in err.value.message
    record.refresh_from_db()
    assert record.status == FailureStatus.UNRESOLVED
