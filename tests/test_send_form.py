"""Sending a message from the dashboard (operators) and the API: through the one send path,
audited with who sent it; a bad body, bad headers or a control header is a clear error on
the form (what was typed kept) and sends nothing; after a send the new message's page opens,
or for a delayed one the delayed page of its queue."""
from __future__ import annotations

import json

import pytest

from core.delayed import delayed_store
from core.messages import Headers
from core.transport import Transport
from dashboard.models import AuditEntry
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, operator, operator_client, viewer, viewer_client,
)

pytestmark = pytest.mark.django_db(transaction=True)


def form(queue: str, **fields: str) -> dict[str, str]:
    return {"queue": queue, "message_type": "", "body": "{}", "headers": "", "delay": "", "ttl": "", **fields}


def last_audit() -> AuditEntry:
    return AuditEntry.objects.order_by("-pk").first()


@pytest.fixture
def delayed(transactional_db):
    store = delayed_store()
    store.setup_infrastructure()
    yield store
    for message in store.list(10_000)[0]:
        store.delete(message.id)


def test_the_form_sends_and_opens_the_new_messages_page(operator_client, operator, queue):
    page = operator_client.get(f"/send/?queue={queue}").content.decode()
    assert f'<option value="{queue}" selected>' in page and 'name="body"' in page
    body = '{\n  "order": 42,\n  "lines": [1, 2]\n}'
    response = operator_client.post("/send/", form(queue, message_type="PlaceOrder", body=body,
                                                   headers='{"Tenant": "acme"}', ttl="600"))
    assert response.status_code == 303
    [m] = Transport().browse(queue)
    assert response["Location"] == f"/queues/{queue}/messages/{m.row_version}/"
    assert m.body == body.encode() and m.message_type == "PlaceOrder" and m.headers["Tenant"] == "acme"
    assert m.headers[Headers.CONTENT_TYPE] == "application/json" and m.expires is not None
    entry = last_audit()
    assert (entry.action, entry.outcome, entry.via, entry.username) == ("send_message", "ok", "web", operator.username)
    assert entry.target_ids == [m.headers[Headers.MESSAGE_ID]] and "type PlaceOrder" in entry.detail
    opened = operator_client.get(response["Location"]).content.decode()
    assert "PlaceOrder" in opened and "sent to" in opened  # the message's page, with the flash message


@pytest.mark.parametrize("fields, error", [
    ({"body": '{"order": 42,}'}, "the body is not JSON"),
    ({"body": ""}, "the body is required"),
    ({"headers": '["Tenant"]'}, "headers must be a JSON object"),
    ({"headers": '{"Tenant": 7}'}, "must have a name and a text value"),
    ({"headers": '{"NServiceBus.FailedQ": "orders"}'}, "NServiceBus.FailedQ: is a Sluice control header"),
    ({"headers": '{"Sluice.RetryOf": "12"}'}, "Sluice.RetryOf: is a Sluice control header"),
    ({"ttl": "-1"}, "must not be negative"),
    ({"delay": "soon"}, "delay must be a number of seconds"),
])
def test_a_refused_message_is_a_clear_error_on_the_form_and_nothing_is_sent(operator_client, queue, fields, error):
    sent = form(queue, message_type="Typed", **fields)
    response = operator_client.post("/send/", sent)
    page = response.content.decode()
    assert response.status_code == 400, page[:500]
    assert "data-send-error" in page and error in page
    assert 'value="Typed"' in page  # what was typed is kept
    assert Transport().browse(queue) == []
    assert (last_audit().action, last_audit().outcome) == ("send_message", "rejected")


def test_a_delayed_send_opens_the_delayed_page(operator_client, queue, delayed):
    response = operator_client.post("/send/", form(queue, body='{"later": true}', delay="3600"))
    assert response.status_code == 303 and response["Location"] == f"/delayed/?destination={queue}"
    [m] = [m for m in delayed.list(1000)[0] if m.destination == queue]
    assert m.body == b'{"later": true}' and Transport().browse(queue) == []
    assert "scheduled in 3600 s" in last_audit().detail


def test_viewers_see_the_form_but_may_not_send(viewer_client, queue):
    page = viewer_client.get(f"/send/?queue={queue}").content.decode()
    assert "disabled" in page
    response = viewer_client.post("/send/", form(queue))
    assert response.status_code == 403 and Transport().browse(queue) == []
    assert (last_audit().action, last_audit().outcome) == ("send_message", "denied")


def test_an_unknown_queue_is_a_404_on_the_form(operator_client, queue):
    response = operator_client.post("/send/", form("no_such_queue"))
    assert response.status_code == 404 and "unknown queue" in response.content.decode()


def test_the_queue_page_links_to_the_form(operator_client, queue):
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert f'href="/send/?queue={queue}"' in page


def test_the_api_sends_through_the_same_path(operator_client, viewer_client, operator, queue, delayed):
    status, body = api(operator_client, "post", f"/api/queues/{queue}/send/",
                       {"body": {"order": 7}, "message_type": "PlaceOrder", "headers": {"Tenant": "acme"}, "ttl": 60})
    assert status == 201 and body["queue"] == queue and not body["delayed"]
    [m] = Transport().browse(queue)
    assert body["row_version"] == m.row_version and body["message_id"] == m.headers[Headers.MESSAGE_ID]
    assert json.loads(m.body) == {"order": 7} and m.message_type == "PlaceOrder"
    assert (last_audit().via, last_audit().username) == ("api", operator.username)

    status, body = api(operator_client, "post", f"/api/queues/{queue}/send/", {"body": 1, "delay": 600})
    assert status == 201 and body["delayed"] and body["row_version"] is None
    status, body = api(operator_client, "post", f"/api/queues/{queue}/send/",
                       {"body": {}, "headers": {"NServiceBus.ExceptionInfo.Message": "x"}})
    assert status == 400 and "control header" in body["error"]
    status, body = api(operator_client, "post", f"/api/queues/{queue}/send/", {"message_type": "NoBody"})
    assert status == 400 and "body is required" in body["error"]
    status, body = api(viewer_client, "post", f"/api/queues/{queue}/send/", {"body": {}})
    assert status == 403
    assert len(Transport().browse(queue)) == 1
