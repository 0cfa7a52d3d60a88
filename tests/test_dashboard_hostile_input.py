"""Hostile requests against the dashboard and the API (issue 35 items 5 and 10): a session's
API write is refused for its role and its CSRF token before its body is read (so a
malformed body from a viewer is a 403, audited), no body gives a 500, and the inputs that
overflowed (a conversation cursor, ?before, a huge row version, deeply nested JSON) get a
clear 4xx."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from dashboard.models import AuditEntry
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401
    _fresh_dashboard_cache, make_user, operator, operator_client, viewer, viewer_client,
)

#: Bodies a parser may choke on: cut short, not JSON, nested past the recursion limit,
#: a number Python will not load, an empty one.
BAD_BODIES = ["{", "not json", "[" * 100_000, '{"confirm": ' + "9" * 5000 + "}", "", "\x00", '{"a": NaN}']


def _csrf_client(user) -> tuple[Client, str]:
    """A client that enforces CSRF like a browser's session does, with its token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/")  # sets the csrftoken cookie
    return client, client.cookies["csrftoken"].value


@pytest.mark.parametrize("body", BAD_BODIES + ['{"confirm": "q"}'])
def test_a_viewers_session_write_is_refused_before_its_body_is_read(viewer, make_queue, body):
    queue = make_queue()
    client, token = _csrf_client(viewer)
    response = client.post(f"/api/queues/{queue}/purge/", body, content_type="application/json",
                           HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 403, response.content[:200]
    assert AuditEntry.objects.filter(action="purge_queue", outcome="denied").count() == 1


@pytest.mark.parametrize("body", BAD_BODIES)
def test_a_wrong_csrf_token_is_refused_before_the_body_is_read(operator, make_queue, body):
    queue = make_queue()
    client, _ = _csrf_client(operator)
    response = client.post(f"/api/queues/{queue}/purge/", body, content_type="application/json",
                           HTTP_X_CSRFTOKEN="x" * 32)
    assert response.status_code == 403 and "CSRF" in response.json()["error"], response.content[:200]


@pytest.mark.parametrize("path", ["/api/queues/{q}/purge/", "/api/alerts/import/", "/api/alerts/rules/",
                                  "/api/alerts/silences/", "/api/failed/retry/", "/api/metrics/run/"])
@pytest.mark.parametrize("body", BAD_BODIES)
def test_no_body_gives_an_operator_a_500(operator, make_queue, path, body):
    client, token = _csrf_client(operator)
    response = client.post(path.format(q=make_queue()), body, content_type="application/json",
                           HTTP_X_CSRFTOKEN=token)
    # An empty body is no JSON to refuse: the endpoint's own answer (an empty import imports nothing).
    assert response.status_code == 400 or (body == "" and response.status_code < 500), \
        (response.status_code, response.content[:200])
    assert response["Content-Type"].startswith("application/json")


# -- 10: more inputs that gave 500s ---------------------------------------------------------------

@pytest.mark.parametrize("path", ["/conversations/x/?cursor=99999999999999999999999.1.1",
                                  "/conversations/x/?cursor=1.99999999999999999999999.1",
                                  "/conversations/x/?cursor=1.1.99999999999999999999999",
                                  "/conversations/x/?cursor=-99999999999999999999999.1.1",
                                  "/failed/?before=9999-12-31T23:59:59-14:00,1",
                                  "/failed/?before=0001-01-01T00:00:00%2B14:00,1",
                                  "/failed/?before=2026-01-01T00:00:00,99999999999999999999999",
                                  "/queues/{q}/messages/99999999999999999999999/",
                                  "/queues/{q}/messages/99999999999999999999999/body",
                                  "/failed/99999999999999999999999/", "/failed/99999999999999999999999/body",
                                  "/failed/99999999999999999999999/edit/"])
def test_overflowing_page_inputs_are_answered(operator_client, make_queue, path):
    """A 4xx that says why, or (a ?before the page did not give out) the first page."""
    response = operator_client.get(path.format(q=make_queue()))
    assert response.status_code < 500, (path, response.status_code)
    assert response.status_code == 200 if "before=" in path else 400 <= response.status_code


@pytest.mark.parametrize("path", ["/api/conversations/x/?cursor=99999999999999999999999.1.1",
                                  "/api/conversations/x/?cursor=1.1.99999999999999999999999",
                                  "/api/failed/99999999999999999999999/",
                                  "/api/operations/99999999999999999999999/",
                                  "/api/alerts/rules/99999999999999999999999/",
                                  "/api/failed/?since=9999-12-31T23:59:59-14:00"])
def test_overflowing_api_inputs_are_a_clear_4xx(viewer_client, path):
    status, body = api(viewer_client, "get", path)
    assert 400 <= status < 500 and body["error"], (path, status, body)


def _nested(depth: int) -> dict:
    value: object = "orders"
    for _ in range(depth):
        value = {"x": value}
    return value  # type: ignore[return-value]


@pytest.mark.parametrize("depth", [50, 900])
def test_deeply_nested_operator_json_is_refused(operator_client, depth):
    rule = {"name": "deep", "kind": "queue_length", "threshold": 1, "filters": {"queue": _nested(depth)}}
    status, body = api(operator_client, "post", "/api/alerts/rules/", rule)
    assert status == 400, body
    status, body = api(operator_client, "post", "/api/alerts/import/", {"rules": [rule]})
    assert status == 400, body
    status, body = api(operator_client, "post", "/api/alerts/silences/", {"minutes": 5, "matchers": _nested(depth)})
    assert status == 400, body
    response = operator_client.post("/alerts/import/", {"config": json.dumps({"rules": [rule]})})
    assert response.status_code in (302, 303, 400)
    deep_text = '{"rules": ' + "[" * 5000 + "]" * 5000 + "}"
    response = operator_client.post("/alerts/import/", {"config": deep_text})
    assert response.status_code in (302, 303, 400)
    from core.models.alerts import AlertRule

    assert not AlertRule.objects.exists()


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=",
                                          "application/x-www-form-urlencoded", "text/plain"])
def test_a_form_body_to_the_api_is_refused_for_a_viewer_and_never_a_500(viewer, operator, make_queue, content_type):
    queue = make_queue()
    for user, expected in ((viewer, 403), (operator, 415)):
        client, token = _csrf_client(user)
        response = client.post(f"/api/queues/{queue}/purge/", "--x\r\n", content_type=content_type,
                               HTTP_X_CSRFTOKEN=token)
        assert response.status_code == expected, (user.username, response.status_code, response.content[:200])
