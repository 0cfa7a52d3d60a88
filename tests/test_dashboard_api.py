"""The JSON API through Django's test client, on the real database and Redis: every endpoint
and its shape, the roles (anonymous / no role / viewer / operator), CSRF on session-auth
writes, token auth, bad input as 4xx ``{"error"}``, hostile message data returned as data."""
from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.test import Client
from dashboard.security import tokens

from core.delayed import delayed_store
from core.messages import Headers
from core.models import BulkOperation, FailedMessage, FailureStatus
from core.transport import Transport
from dashboard.models import AuditEntry
from tests.dashboard_api_support import api, clean_broker, nobody_client, queued_operations, run_queued  # noqa: F401
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    XSS_IMG, XSS_SCRIPT, _fresh_dashboard_cache, fail_message, operator, operator_client, viewer, viewer_client,
)

READS = ["/api/queues/", "/api/failed/", "/api/failed/groups/", "/api/audit/", "/api/operations/", "/api/outbox/"]


def ids_in(queue: str) -> list[str]:
    return [m.id for m in Transport().browse(queue, limit=1000)]


@pytest.fixture
def delayed(transactional_db):
    """The delayed store, empty: before the test too, since the store's table outlives the
    tests that leave delayed retries in it."""
    store = delayed_store()
    store.setup_infrastructure()

    def empty() -> None:
        for message in store.list(10_000)[0]:
            store.delete(message.id)

    empty()
    yield store
    empty()


# -- who may do what ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", READS)
def test_anonymous_gets_403_json(client, db, path):
    status, body = api(client, "get", path)
    assert status in (401, 403) and "error" in body


def test_anonymous_cannot_delete_and_nothing_changes(client, queue):
    mid = Transport().send(queue, "keep")
    status, body = api(client, "delete", f"/api/queues/{queue}/messages/{mid}/")
    assert status in (401, 403) and body["error"]
    assert ids_in(queue) == [mid]


def test_a_user_without_a_role_sees_nothing(nobody_client, queue):
    status, body = api(nobody_client, "get", "/api/queues/")
    assert status == 403 and "role" in body["error"]


@pytest.mark.parametrize("path", READS)
def test_viewer_reads(viewer_client, error_queue, path):
    status, body = api(viewer_client, "get", path)
    assert status == 200 and isinstance(body, dict)


def test_viewer_actions_are_refused_and_change_nothing(viewer_client, queue, error_queue, delayed):
    mid = Transport().send(queue, "keep")
    record = fail_message(queue)
    later = Transport().send(queue, "later", delay=3600)
    attempts = [
        ("delete", f"/api/queues/{queue}/messages/{mid}/", None),
        ("post", f"/api/queues/{queue}/purge/", {"confirm": queue}),
        ("post", f"/api/queues/{queue}/messages/{mid}/move/", {"to": "error"}),
        ("post", f"/api/delayed/{later}/deliver-now/", {}),
        ("delete", f"/api/delayed/{later}/", None),
        ("post", "/api/failed/retry/", {"ids": [record.pk]}),
        ("post", "/api/failed/archive/", {"all": True}),
        ("post", "/api/failed/restore/", {"ids": [record.pk]}),
        ("post", "/api/failed/delete/", {"ids": [record.pk]}),
        ("post", f"/api/failed/{record.pk}/edit-retry/", {"body": "changed"}),
        ("post", "/api/outbox/x/dispatch/", {}),
    ]
    for method, path, data in attempts:
        status, body = api(viewer_client, method, path, data)
        assert status == 403, (path, status, body)
        assert "operator" in body["error"]
    assert ids_in(queue) == [mid]
    assert [m.id for m in delayed.list()[0]] == [later]
    record.refresh_from_db()
    assert record.status == FailureStatus.UNRESOLVED and record.body == b'{"order": 7}'
    assert not BulkOperation.objects.exists()


# -- queues ------------------------------------------------------------------------------------------

def test_queue_list_shape(operator_client, make_queue):
    name = make_queue()
    Transport().send(name, "a")
    Transport().send(name, "b", ttl=0)
    status, body = api(operator_client, "get", "/api/queues/")
    assert status == 200
    row = next(q for q in body["queues"] if q["name"] == name)
    assert {k: row[k] for k in ("name", "kind", "pending", "expired", "delayed_due", "scheduled")} == {
        "name": name, "kind": "normal", "pending": 1, "expired": 1, "delayed_due": 0, "scheduled": 0}


def test_messages_shape_paging_and_binary_bodies(operator_client, queue):
    t = Transport()
    first = t.send(queue, "héllo", ttl=3600)
    second = t.send(queue, b"\xff\xfe\x00binary")
    status, body = api(operator_client, "get", f"/api/queues/{queue}/messages/?limit=1&bodies=1")
    assert status == 200
    (m,) = body["messages"]
    assert set(m) >= {"id", "row_version", "headers", "body", "body_base64", "expires"}
    assert m["id"] == first and m["body"] == "héllo" and m["headers"][Headers.MESSAGE_ID] == first
    assert m["expires"] is not None and body["next_after"] == m["row_version"]
    status, body = api(operator_client, "get", f"/api/queues/{queue}/messages/?limit=5&bodies=1&after={m['row_version']}")
    (m2,) = body["messages"]
    assert m2["id"] == second and m2["body"] is None and m2["body_base64"] == "//4AYmluYXJ5"
    assert m2["expires"] is None and body["next_after"] is None


def test_delete_one_message(operator_client, queue):
    keep, gone = Transport().send(queue, "keep"), Transport().send(queue, "gone")
    status, body = api(operator_client, "delete", f"/api/queues/{queue}/messages/{gone}/")
    assert (status, body) == (200, {"deleted": 1})
    assert ids_in(queue) == [keep]
    status, body = api(operator_client, "delete", f"/api/queues/{queue}/messages/{gone}/")
    assert status == 404 and "none of the 1 message" in body["error"]


def test_purge_needs_the_queue_name(operator_client, queue, clean_broker):
    for _ in range(3):
        Transport().send(queue, "x")
    status, body = api(operator_client, "post", f"/api/queues/{queue}/purge/", {"confirm": queue.upper()})
    assert status == 400 and "type the queue name" in body["error"]
    assert len(ids_in(queue)) == 3
    status, body = api(operator_client, "post", f"/api/queues/{queue}/purge/", {"confirm": queue})
    assert status == 202 and body["count"] == 3
    assert run_queued(body["operation"]).done == 3
    assert ids_in(queue) == []


def test_move_a_message(operator_client, make_queue):
    a, b = make_queue(), make_queue()
    mid = Transport().send(a, "moving", ttl=3600)
    status, body = api(operator_client, "post", f"/api/queues/{a}/messages/{mid}/move/", {"to": b})
    assert status == 200 and body["moved"] == 1
    assert ids_in(a) == [] and ids_in(b) == [mid]
    (moved,) = Transport().browse(b)
    assert moved.body == b"moving" and moved.expires is not None


@pytest.mark.parametrize("method,path,data,code,text", [
    ("get", "/api/queues/no_such_queue/messages/", None, 404, "unknown queue"),
    ("get", "/api/queues/bad name!/messages/", None, 404, "unknown queue"),
    ("get", "/api/queues/{q}/messages/?limit=0", None, 400, "limit must be between"),
    ("get", "/api/queues/{q}/messages/?limit=abc", None, 400, "whole number"),
    ("get", "/api/queues/{q}/messages/?after=-1", None, 400, "after must be between"),
    ("post", "/api/queues/{q}/purge/", "{not json", 400, "malformed JSON"),
    ("post", "/api/queues/{q}/purge/", ["a", "list"], 400, "JSON object"),
    ("post", "/api/queues/{q}/purge/", {}, 400, "type the queue name"),
    ("post", "/api/queues/no_such_queue/purge/", {"confirm": "no_such_queue"}, 404, "unknown queue"),
    ("post", "/api/queues/{q}/messages/x/move/", {"to": "no_such_queue"}, 404, "unknown queue"),
    ("delete", "/api/queues/{q}/messages/{long}/", None, 400, "malformed id"),
    ("get", "/api/failed/?status=bogus", None, 400, "status must be one of"),
    ("get", "/api/failed/?since=yesterday", None, 400, "ISO 8601"),
    ("get", "/api/failed/groups/?by=colour", None, 400, "by must be"),
    ("get", "/api/failed/999999/", None, 404, "does not exist"),
    ("post", "/api/failed/retry/", {}, 400, "exactly one of"),
    ("post", "/api/failed/retry/", {"ids": ["one", "two"]}, 400, "malformed id"),
    ("post", "/api/failed/retry/", {"ids": [999999]}, 404, "none of the selected"),
    ("post", "/api/failed/retry/", {"group": "0123456789abcdef"}, 404, "no failed messages in group"),
    ("post", "/api/failed/retry/", {"all": True, "older_than_days": 3}, 400, "archive only"),
    ("post", "/api/failed/archive/", {"all": True, "older_than_days": "soon"}, 400, "must be a number"),
    ("post", "/api/failed/archive/", {"all": True}, 409, "nothing to archive"),
    ("post", "/api/failed/999999/edit-retry/", {"body": "x"}, 404, "does not exist"),
    ("post", "/api/failed/1/edit-retry/", {"headers": {}}, 400, '"body" is required'),
    ("get", "/api/operations/999999/", None, 404, "does not exist"),
    ("get", "/api/audit/?action=dance", None, 400, "action must be one of"),
    ("get", "/api/delayed/?limit=100000", None, 400, "limit must be between"),
])
def test_bad_input_is_a_4xx_json_error(operator_client, queue, error_queue, method, path, data, code, text):
    path = path.format(q=queue, long="x" * 300)
    status, body = api(operator_client, method, path, data)
    assert status == code, (status, body)
    assert text in body["error"] and set(body) == {"error"}


# -- delayed ---------------------------------------------------------------------------------------

def test_delayed_list_deliver_now_and_delete(operator_client, make_queue, delayed):
    a, b = make_queue(), make_queue()
    first = Transport().send(a, "one", delay=3600)
    second = Transport().send(b, "two", delay=7200)
    status, body = api(operator_client, "get", f"/api/delayed/?destination={a}")
    assert status == 200 and [d["id"] for d in body["delayed"]] == [first]
    assert set(body["delayed"][0]) >= {"id", "destination", "due"} and body["delayed"][0]["destination"] == a
    due_before = dt.datetime.fromisoformat(body["delayed"][0]["due"])
    status, body = api(operator_client, "post", f"/api/delayed/{first}/deliver-now/", {})
    assert (status, body) == (200, {"delivered": 1})
    (row,) = [m for m in delayed.list()[0] if m.id == first]
    assert row.due < due_before - dt.timedelta(minutes=50)
    status, body = api(operator_client, "delete", f"/api/delayed/{second}/")
    assert (status, body) == (200, {"deleted": 1})
    assert second not in [m.id for m in delayed.list()[0]]
    status, body = api(operator_client, "delete", f"/api/delayed/{second}/")
    assert status == 404


# -- failed messages ------------------------------------------------------------------------------

def test_failed_search_and_groups_shapes(operator_client, queue, error_queue):
    a = fail_message(queue, exception_type="TimeoutError", exception_message="order 4711 timed out")
    fail_message(queue, exception_type="TimeoutError", exception_message="order 4712 timed out")
    fail_message(queue, exception_type="KeyError", frame="other")
    status, body = api(operator_client, "get", "/api/failed/?q=4711")
    assert status == 200 and body["count"] == 1
    (row,) = body["results"]
    assert {k: row[k] for k in ("id", "message_id", "queue", "exception_type", "status", "attempts")} == {
        "id": a.pk, "message_id": a.message_id, "queue": queue, "exception_type": "TimeoutError",
        "status": "unresolved", "attempts": 6}
    assert set(row) >= {"message_type", "exception_message", "group_key", "time_of_failure"}
    status, body = api(operator_client, "get", f"/api/failed/?queue={queue}&status=unresolved&limit=2")
    assert body["count"] == 3 and len(body["results"]) == 2
    status, body = api(operator_client, "get", f"/api/failed/?group={a.group_key}")
    assert body["count"] == 2
    status, body = api(operator_client, "get", "/api/failed/groups/")
    groups = {g["key"]: g for g in body["groups"]}
    g = groups[a.group_key]
    assert g["count"] == 2 and g["title"] == a.group_title and g["first_failed_at"] <= g["last_failed_at"]
    status, body = api(operator_client, "get", f"/api/failed/{a.pk}/")
    assert body["stack_trace"] and body["body"] == '{"order": 7}' and body["history"][0]["event"] == "failed"


def test_retry_selected_runs_as_an_operation(operator_client, queue, error_queue, clean_broker):
    record = fail_message(queue)
    status, body = api(operator_client, "post", "/api/failed/retry/", {"ids": [record.pk]})
    assert status == 202 and body["count"] == 1
    op_id = body["operation"]
    status, body = api(operator_client, "get", f"/api/operations/{op_id}/")
    assert {k: body[k] for k in ("id", "kind", "status", "total", "done", "failed")} == {
        "id": op_id, "kind": "retry", "status": "pending", "total": 1, "done": 0, "failed": 0}
    run_queued(op_id)
    status, body = api(operator_client, "get", f"/api/operations/{op_id}/")
    assert (body["status"], body["done"]) == ("finished", 1)
    assert ids_in(queue) == [str(uuid.UUID(record.message_id))]
    record.refresh_from_db()
    assert record.status == FailureStatus.RETRY_PENDING


def test_archive_a_group_then_restore(operator_client, queue, error_queue, clean_broker):
    a = fail_message(queue)
    b = fail_message(queue)
    other = fail_message(queue, exception_type="KeyError", frame="elsewhere")
    status, body = api(operator_client, "post", "/api/failed/archive/", {"group": a.group_key})
    assert status == 202 and body["count"] == 2
    run_queued(body["operation"])
    assert {r.message_id: r.status for r in FailedMessage.objects.all()} == {
        a.message_id: "archived", b.message_id: "archived", other.message_id: "unresolved"}
    status, body = api(operator_client, "post", "/api/failed/restore/", {"ids": [a.pk]})
    assert status == 202
    run_queued(body["operation"])  # a worker restores (item 3: not in the request)
    status, op = api(operator_client, "get", f"/api/operations/{body['operation']}/")
    assert (op["kind"], op["status"], op["done"]) == ("restore", "finished", 1)
    a.refresh_from_db()
    assert a.status == "unresolved"


def test_archive_older_than_days(operator_client, queue, error_queue, clean_broker):
    old = fail_message(queue, failed_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10))
    new = fail_message(queue)
    status, body = api(operator_client, "post", "/api/failed/archive/", {"all": True, "older_than_days": 7})
    assert status == 202 and body["count"] == 1
    run_queued(body["operation"])
    old.refresh_from_db(), new.refresh_from_db()
    assert (old.status, new.status) == ("archived", "unresolved")


def test_edit_and_retry_sends_a_copy_with_a_new_id(operator_client, queue, error_queue):
    record = fail_message(queue, headers={"Shop.Region": "eu"})
    status, body = api(operator_client, "post", f"/api/failed/{record.pk}/edit-retry/",
                       {"body": '{"order": 8}', "headers": {"Shop.Region": "us", Headers.MESSAGE_ID: record.message_id}})
    assert status == 200
    new_id = body["message_id"]
    assert new_id != record.message_id
    (copy,) = Transport().browse(queue)
    assert copy.body == b'{"order": 8}' and copy.headers[Headers.MESSAGE_ID] == new_id
    assert copy.headers[Headers.CORRELATION_ID] == record.message_id and copy.headers["Shop.Region"] == "us"
    assert Headers.EXCEPTION_TYPE not in copy.headers
    record.refresh_from_db()
    assert record.status == FailureStatus.RESOLVED and record.history[-1]["new_message_id"] == new_id
    status, body = api(operator_client, "post", f"/api/failed/{record.pk}/edit-retry/", {"body": "again"})
    assert status == 409 and "resolved" in body["error"]


def test_edit_cannot_change_protected_headers(operator_client, queue, error_queue):
    record = fail_message(queue)
    status, body = api(operator_client, "post", f"/api/failed/{record.pk}/edit-retry/",
                       {"body": "x", "headers": {Headers.MESSAGE_ID: "forged"}})
    assert status == 400 and "protected" in body["error"]
    status, body = api(operator_client, "post", f"/api/failed/{record.pk}/edit-retry/",
                       {"body": "x", "headers": {"nested": {"no": 1}}})
    assert status == 400 and "headers" in body["error"]
    assert Transport().browse(queue) == []
    record.refresh_from_db()
    assert record.status == FailureStatus.UNRESOLVED


def test_delete_failed(operator_client, queue, error_queue):
    record = fail_message(queue)
    status, body = api(operator_client, "post", "/api/failed/delete/", {"message_ids": [record.message_id]})
    assert (status, body) == (200, {"deleted": 1})
    assert not FailedMessage.objects.exists()


def test_retry_with_redis_down_fails_visibly(operator_client, queue, error_queue, settings):
    record = fail_message(queue)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    status, body = api(operator_client, "post", "/api/failed/retry/", {"ids": [record.pk]})
    assert status == 503 and "Redis" in body["error"]
    (op,) = BulkOperation.objects.all()
    assert op.status == "failed" and "could not queue" in op.error
    assert AuditEntry.objects.get(action="retry_failed").outcome == "error"


# -- audit, schema -----------------------------------------------------------------------------------

def test_audit_filters(operator_client, operator, viewer_client, viewer, queue):
    mid = Transport().send(queue, "x")
    api(viewer_client, "delete", f"/api/queues/{queue}/messages/{mid}/")
    api(operator_client, "delete", f"/api/queues/{queue}/messages/{mid}/")
    status, body = api(viewer_client, "get", f"/api/audit/?user={operator.username}&action=delete_messages")
    assert status == 200
    (entry,) = body["entries"]
    assert {k: entry[k] for k in ("user", "action", "outcome")} == {
        "user": operator.username, "action": "delete_messages", "outcome": "ok"}
    assert mid in entry["target"] and entry["at"]
    status, body = api(viewer_client, "get", f"/api/audit/?user={viewer.username}")
    assert [e["outcome"] for e in body["entries"]] == ["denied"]


def test_openapi_schema_is_served(viewer_client):
    response = viewer_client.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert {"/api/queues/", "/api/failed/retry/", "/api/failed/{id}/edit-retry/", "/api/audit/"} <= set(paths)


# -- CSRF and tokens ----------------------------------------------------------------------------------

def test_session_writes_need_the_csrf_token(operator, queue):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    mid = Transport().send(queue, "keep")
    status, body = api(client, "delete", f"/api/queues/{queue}/messages/{mid}/")
    assert status == 403 and "CSRF" in body["error"]
    status, body = api(client, "post", f"/api/queues/{queue}/purge/", {"confirm": queue})
    assert status == 403 and "CSRF" in body["error"]
    assert ids_in(queue) == [mid]
    client.get("/api/queues/")  # any page sets the cookie; the browser sends it back as a header
    token = client.cookies["csrftoken"].value if "csrftoken" in client.cookies else None
    if token is None:
        client.get("/accounts/login/")
        token = client.cookies["csrftoken"].value
    status, body = api(client, "delete", f"/api/queues/{queue}/messages/{mid}/", HTTP_X_CSRFTOKEN=token)
    assert (status, body) == (200, {"deleted": 1})


def test_token_auth_for_scripts(operator, viewer, queue):
    mid = Transport().send(queue, "x")
    client = Client(enforce_csrf_checks=True)  # a script has no session and no CSRF cookie
    status, _ = api(client, "get", "/api/queues/", HTTP_AUTHORIZATION="Token not-a-token")
    assert status in (401, 403)
    viewer_token = tokens.issue(viewer)[1]
    status, _ = api(client, "get", "/api/queues/", HTTP_AUTHORIZATION=f"Token {viewer_token}")
    assert status == 200
    status, _ = api(client, "delete", f"/api/queues/{queue}/messages/{mid}/",
                    HTTP_AUTHORIZATION=f"Token {viewer_token}")
    assert status == 403 and ids_in(queue) == [mid]
    token = tokens.issue(operator)[1]
    status, body = api(client, "delete", f"/api/queues/{queue}/messages/{mid}/", HTTP_AUTHORIZATION=f"Token {token}")
    assert (status, body) == (200, {"deleted": 1})
    assert AuditEntry.objects.filter(action="delete_messages", outcome="ok").get().via == "api"


# -- hostile data stays data ------------------------------------------------------------------------

def test_script_in_bodies_and_headers_comes_back_as_data(operator_client, queue, error_queue):
    mid = Transport().send(queue, XSS_SCRIPT, headers={"X-Evil": XSS_IMG})
    response = operator_client.get(f"/api/queues/{queue}/messages/?bodies=1")
    assert response["Content-Type"] == "application/json"
    (m,) = response.json()["messages"]
    assert m["id"] == mid and m["body"] == XSS_SCRIPT and m["headers"]["X-Evil"] == XSS_IMG
    record = fail_message(queue, body=XSS_SCRIPT, exception_message=XSS_IMG)
    body = operator_client.get(f"/api/failed/{record.pk}/").json()
    assert body["body"] == XSS_SCRIPT and body["exception_message"] == XSS_IMG
    (row,) = operator_client.get(f"/api/failed/?message_id={record.message_id}").json()["results"]
    assert row["exception_message"] == XSS_IMG
