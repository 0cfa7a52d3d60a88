"""Operator actions from the pages' forms: a viewer gets 403 and nothing changes (the denial is
audited); an operator's action happens, the audit entry exists, and bad input is a 4xx page."""
from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client

from core import failures
from core.delayed import delayed_store
from core.messages import Headers
from core.models import BulkOperation, FailedMessage
from core.transport import Transport
from dashboard.models import AuditEntry
from tests.dashboard_api_support import clean_broker, run_queued  # noqa: F401 — fixture
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, fail_message, operator, operator_client, viewer, viewer_client,
)


def audited(action: str, outcome: str = "ok") -> AuditEntry:
    entry = AuditEntry.objects.filter(action=action).order_by("-pk").first()
    assert entry is not None, f"no audit entry for {action}"
    assert entry.outcome == outcome, (entry.outcome, entry.detail)
    assert entry.via == "web"
    return entry


def ids_in(queue: str) -> list[str]:
    return [m.id for m in Transport().browse(queue, limit=1000)]


# -- queues ------------------------------------------------------------------------------------------

def test_delete_selected_messages(operator_client, viewer_client, viewer, queue):
    keep, drop1, drop2 = (Transport().send(queue, x) for x in ("keep", "d1", "d2"))
    rows = {m.headers[Headers.MESSAGE_ID]: m.id for m in Transport().browse(queue)}
    data = {"ids": [rows[drop1], rows[drop2]], "next": f"/queues/{queue}/?type=x"}
    denied = Client()
    denied.force_login(viewer)
    response = denied.post(f"/queues/{queue}/delete/", data)
    assert response.status_code == 403 and b"Only operators" in response.content
    assert len(ids_in(queue)) == 3
    assert audited("delete_messages", "denied").username == viewer.username
    response = operator_client.post(f"/queues/{queue}/delete/", data)
    assert response.status_code == 303 and response["Location"] == f"/queues/{queue}/?type=x"
    assert ids_in(queue) == [rows[keep]]
    entry = audited("delete_messages")
    assert rows[drop1] in entry.target_ids
    page = operator_client.get(response["Location"]).content.decode()
    assert "2 message(s) deleted" in page  # the flash message
    nothing = operator_client.post(f"/queues/{queue}/delete/", {})
    assert nothing.status_code == 400 and b"banner bad" in nothing.content


def test_purge_needs_the_queue_name_typed(operator_client, viewer_client, queue, clean_broker):
    Transport().send_many(queue, ["a", "b", "c"])
    assert viewer_client.post(f"/queues/{queue}/purge/", {"confirm": queue}).status_code == 403
    wrong = operator_client.post(f"/queues/{queue}/purge/", {"confirm": "orders"})
    assert wrong.status_code == 400 and f"type the queue name ({queue})".encode() in wrong.content
    assert len(ids_in(queue)) == 3
    assert audited("purge_queue", "rejected")
    assert operator_client.post(f"/queues/{queue}/purge/", {"confirm": queue}).status_code == 303
    entry = audited("purge_queue")
    assert f"operation {entry.operation_id} queued: about 3 message(s)" in entry.detail
    assert len(ids_in(queue)) == 3  # the request only queued it: a worker purges
    assert run_queued(entry.operation_id).done == 3
    assert ids_in(queue) == []


def test_move_a_message_to_another_queue(operator_client, viewer_client, make_queue):
    a, b = make_queue(), make_queue()
    mid = Transport().send(a, "moving")
    row = Transport().browse(a)[0].id
    assert viewer_client.post(f"/queues/{a}/move/", {"id": row, "to": b}).status_code == 403
    assert ids_in(a) == [row]
    assert operator_client.post(f"/queues/{a}/move/", {"id": row, "to": b}).status_code == 303
    assert ids_in(a) == [] and Transport().browse(b)[0].headers[Headers.MESSAGE_ID] == mid
    assert audited("move_message")
    assert operator_client.post(f"/queues/{b}/move/", {"id": row, "to": "no_such_q"}).status_code == 404


# -- delayed and outbox -------------------------------------------------------------------------------

@pytest.fixture
def delayed_in(make_queue):
    store = delayed_store()
    store.setup_infrastructure()
    queue = make_queue()
    made = []

    def make(delay: float = 3600) -> str:
        mid = Transport().send(queue, "later", delay=delay)
        made.append(mid)
        return next(m.id for m in store.list(1000)[0] if m.headers.get(Headers.MESSAGE_ID) == mid)

    make.queue = queue
    yield make
    for m in store.list(1000)[0]:
        if m.destination == queue:
            store.delete(m.id)


def test_deliver_now_and_delete_delayed(operator_client, viewer_client, delayed_in):
    store = delayed_store()
    first, second = delayed_in(), delayed_in()
    assert viewer_client.post(f"/delayed/{first}/deliver-now/").status_code == 403
    assert viewer_client.post(f"/delayed/{second}/delete/").status_code == 403
    items, now = store.list(1000)
    assert all(m.due > now for m in items if m.id in (first, second))
    assert operator_client.post(f"/delayed/{first}/deliver-now/").status_code == 303
    items, now = store.list(1000)
    assert next(m for m in items if m.id == first).due <= now
    assert audited("deliver_delayed_now")
    assert operator_client.post(f"/delayed/{second}/delete/").status_code == 303
    assert second not in [m.id for m in store.list(1000)[0]]
    assert audited("delete_delayed")
    assert operator_client.post(f"/delayed/{second}/delete/").status_code == 404


def stuck_session(message_id: str, queue: str, monkeypatch) -> None:
    """An outbox session whose process died between its commit and phase 2: the record stays
    undispatched, its messages unsent."""
    from core.outbox import Outbox, OutboxSession

    with monkeypatch.context() as patch:
        patch.setattr(Outbox, "after_commit", lambda self, ids: None)
        with OutboxSession(message_id=message_id) as session:
            session.send(queue, "x")


def test_dispatch_an_outbox_record_now(operator_client, viewer_client, outbox, queue, monkeypatch):
    stuck_session("stuck-1", queue, monkeypatch)
    assert viewer_client.post("/outbox/stuck-1/dispatch/").status_code == 403
    assert outbox.store.state("stuck-1") == (False, False) and ids_in(queue) == []
    assert operator_client.post("/outbox/stuck-1/dispatch/").status_code == 303
    assert outbox.store.state("stuck-1") == (True, False) and len(ids_in(queue)) == 1
    assert "1 dispatched" in audited("dispatch_outbox").detail
    assert operator_client.post("/outbox/stuck-1/dispatch/").status_code == 409


# -- failed messages -------------------------------------------------------------------------------------

def test_retry_a_group_starts_an_operation_that_sends_the_messages_back(operator_client, viewer_client, queue,
                                                                        error_queue):
    records = [fail_message(queue, frame="group_me") for _ in range(3)]
    other = fail_message(queue, exception_type="KeyError")
    group = records[0].group_key
    assert viewer_client.post("/failed/retry/", {"group": group}).status_code == 403
    assert not BulkOperation.objects.exists()
    assert audited("retry_failed", "denied")
    response = operator_client.post("/failed/retry/", {"group": group, "next": "/failed/?by=exception"})
    assert response.status_code == 303 and response["Location"] == "/failed/?by=exception"
    op = BulkOperation.objects.get()
    assert op.kind == "retry" and op.total == 3
    assert audited("retry_failed").operation_id == op.pk
    # The page shows it running, polling; then a worker runs it (here: the worker's function).
    page = operator_client.get("/failed/").content.decode()
    assert f'data-operation="{op.pk}"' in page and 'hx-trigger="every 1s"' in page
    failures.run_operation(op.pk)
    assert sorted(m.headers[Headers.MESSAGE_ID] for m in Transport().browse(queue)) == \
        sorted(r.message_id for r in records)
    assert FailedMessage.objects.get(pk=other.pk).status == "unresolved"
    assert set(FailedMessage.objects.filter(group_key=group).values_list("status", flat=True)) == {"retry_pending"}


def test_retry_selected_and_all(operator_client, queue, error_queue):
    a, b, c = (fail_message(queue) for _ in range(3))
    assert operator_client.post("/failed/retry/", {"ids": [a.pk, b.pk]}).status_code == 303
    assert BulkOperation.objects.latest("pk").total == 2
    assert operator_client.post("/failed/retry/", {"all": "1", "queue": queue}).status_code == 303
    assert BulkOperation.objects.latest("pk").total == 3
    htmx = operator_client.post("/failed/retry/", {"ids": [c.pk]}, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 204 and htmx["HX-Redirect"] == "/failed/"


def test_archive_restore_and_archive_older_than(operator_client, viewer_client, queue, error_queue):
    old = fail_message(queue, failed_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30))
    new = fail_message(queue)
    assert viewer_client.post("/failed/archive/", {"ids": [new.pk]}).status_code == 403
    assert operator_client.post("/failed/archive/", {"all": "1", "older_than_days": "7"}).status_code == 303
    op = BulkOperation.objects.latest("pk")
    assert op.kind == "archive" and op.total == 1
    failures.run_operation(op.pk)
    assert FailedMessage.objects.get(pk=old.pk).status == "archived"
    assert FailedMessage.objects.get(pk=new.pk).status == "unresolved"
    assert viewer_client.post("/failed/restore/", {"ids": [old.pk]}).status_code == 403
    assert FailedMessage.objects.get(pk=old.pk).status == "archived"
    assert operator_client.post("/failed/restore/", {"ids": [old.pk]}).status_code == 303
    failures.run_operation(BulkOperation.objects.latest("pk").pk)  # what the worker does
    assert FailedMessage.objects.get(pk=old.pk).status == "unresolved"
    assert audited("restore_failed") and audited("archive_failed")
    archived_list = operator_client.get("/failed/?status=archived").content.decode()
    assert old.message_id not in archived_list.split('id="failures"')[1]
    bad = operator_client.post("/failed/archive/", {"all": "1", "older_than_days": "soon"})
    assert bad.status_code == 400


def test_delete_failed_records(operator_client, viewer_client, queue, error_queue):
    record = fail_message(queue)
    assert viewer_client.post("/failed/delete/", {"ids": [record.pk]}).status_code == 403
    assert FailedMessage.objects.filter(pk=record.pk).exists()
    response = operator_client.post("/failed/delete/", {"ids": [record.pk], "next": f"/failed/{record.pk}/"})
    assert response.status_code == 303 and response["Location"] == "/failed/"  # not back to a page that is gone
    assert not FailedMessage.objects.filter(pk=record.pk).exists()
    assert audited("delete_failed")
    assert operator_client.post("/failed/delete/", {"group": "abc"}).status_code == 400


def test_edit_and_retry_sends_a_corrected_copy(operator_client, viewer_client, queue, error_queue):
    record = fail_message(queue, body='{"sku": "bad"}', headers={"Tenant": "acme", "Stale": "x"})
    form = {"body": '{"sku": "A-1"}', "hk": ["Tenant", "Added", ""], "hv": ["globex", "yes", ""]}
    assert viewer_client.get(f"/failed/{record.pk}/edit/").status_code == 200  # looking is fine
    assert viewer_client.post(f"/failed/{record.pk}/edit/", form).status_code == 403
    assert ids_in(queue) == [] and FailedMessage.objects.get(pk=record.pk).status == "unresolved"
    response = operator_client.post(f"/failed/{record.pk}/edit/", form)
    assert response.status_code == 303 and response["Location"] == f"/failed/{record.pk}/"
    (copy,) = Transport().browse(queue)
    assert copy.body == b'{"sku": "A-1"}'
    assert copy.headers["Tenant"] == "globex" and copy.headers["Added"] == "yes" and "Stale" not in copy.headers
    assert copy.headers[Headers.MESSAGE_ID] != record.message_id
    assert copy.headers[Headers.CORRELATION_ID] == record.message_id
    assert FailedMessage.objects.get(pk=record.pk).status == "resolved"
    assert audited("edit_and_retry")
    detail = operator_client.get(response["Location"]).content.decode()
    assert "edited copy sent" in detail.lower() and "cannot be retried again" in detail
    again = operator_client.post(f"/failed/{record.pk}/edit/", form)
    assert again.status_code == 409 and len(ids_in(queue)) == 1


def test_edit_of_a_binary_body_is_refused(operator_client, queue, error_queue):
    record = fail_message(queue, body=b"\xff\xfe\x00binary")
    assert operator_client.get(f"/failed/{record.pk}/edit/").status_code == 400
    assert operator_client.post(f"/failed/{record.pk}/edit/", {"body": "x"}).status_code == 400
    assert FailedMessage.objects.get(pk=record.pk).status == "unresolved"


def test_htmx_errors_go_to_the_flash_region_with_their_status(operator_client, queue, error_queue):
    response = operator_client.post("/failed/retry/", {}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#flash" and response["HX-Reswap"] == "innerHTML"
    assert b'class="banner bad"' in response.content and b"<html" not in response.content
    page = operator_client.get("/failed/").content.decode()
    assert 'id="flash"' in page and '"[45]..", "swap": true' in page


def test_archived_groups_can_be_restored_as_a_group(operator_client, queue, error_queue):
    records = [fail_message(queue, frame="arch") for _ in range(2)]
    FailedMessage.objects.filter(pk__in=[r.pk for r in records]).update(status="archived")
    html = operator_client.get("/failed/?status=archived").content.decode()
    row = html.split(f'data-group="{records[0].group_key}"')[1].split("</tr>")[0]
    assert "Restore group" in row
    assert operator_client.post("/failed/restore/", {"group": records[0].group_key}).status_code == 303
    op = BulkOperation.objects.latest("pk")
    assert (op.kind, op.total, op.status) == ("restore", 2, "pending")  # the request only queued it
    failures.run_operation(op.pk)
    assert set(FailedMessage.objects.values_list("status", flat=True)) == {"unresolved"}


def test_an_operation_no_worker_takes_is_flagged(operator_client, queue, error_queue):
    record = fail_message(queue)
    op = failures.retry([record.message_id])
    BulkOperation.objects.filter(pk=op.pk).update(created_at=op.created_at - dt.timedelta(seconds=60))
    html = operator_client.get("/failed/operations/").content.decode()
    assert "waiting for a worker" in html


def test_a_bulk_action_with_the_broker_down_says_so_and_leaves_nothing_pending(operator_client, settings, queue,
                                                                               error_queue):
    record = fail_message(queue)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = operator_client.post("/failed/retry/", {"ids": [record.pk]})
    assert response.status_code == 503 and b"unreachable" in response.content
    assert FailedMessage.objects.get(pk=record.pk).status == "unresolved"
    assert not BulkOperation.objects.exclude(status="failed").exists()
