"""Crafted message data against the dashboard (issue 35 items 1-3 and 11): a viewer must not
recover a masked header through the queue filter, a poison message's raw header text is
masked like its headers, an id in a URL never leaves its own route (resolved as a browser
resolves it), and a JSON body Python cannot load is not shown in clear when masked fields
are configured.  In Chromium: test_browser_hostile.py."""
from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings as hypothesis_settings, strategies as st

from core import failures
from core.delayed import delayed_store
from core.messages import Headers
from core.models import FailedMessage
from core.queues import create_queue, delete_queue, dialect, registry
from core.scheduling import DelayedMessage
from core.transport import Transport
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401
    _fresh_dashboard_cache, fail_message, operator, operator_client, viewer, viewer_client,
)
from tests.url_safety import browser_resolve, problems, urls_in

SECRET = "Bearer TOPSECRET-abc123"
POISON_SECRET = "Bearer POISON-SECRET-777"
#: Ids a browser would resolve out of their route if they went into a URL unencoded.
CRAFTED_IDS = ["../alerts/rules/1", "%2E%2E/x", "..", ".", "%2e%2e", "a/../../alerts/rules/1", "./x", "~2F..",
               "a?b#c", "..\\alerts", "order/42"]


@pytest.fixture
def masking(settings):
    settings.SLUICE_MASK_HEADERS = ("Authorization",)
    settings.SLUICE_MASK_BODY_FIELDS = ("number", "cvc", "password")


# -- 1: the queue filter --------------------------------------------------------------------------

def test_a_masked_header_cannot_be_searched_by_its_value(viewer_client, queue, masking):
    Transport().send(queue, "{}", headers={"Authorization": SECRET, "Tenant": "acme"})
    listed = lambda header, value: viewer_client.get(f"/queues/{queue}/", {"header": header, "value": value})
    # One character at a time would recover it: a right and a wrong guess must look the same.
    right, wrong = listed("Authorization", "Bearer TOPSECRET-a"), listed("Authorization", "Bearer TOPSECRET-b")
    assert right.status_code == wrong.status_code == 200
    # The value of a masked header is not looked at (the name still filters): both list the row.
    assert right.content.count(b"/messages/") == wrong.content.count(b"/messages/") == 1
    assert listed("authorization", "Bearer TOPSECRET-a").content.count(b"/messages/") == \
        listed("authorization", "Bearer TOPSECRET-b").content.count(b"/messages/")
    assert b"masked" in right.content  # the page says why the value is not looked at
    assert listed("Authorization", "zzz").content.count(b"/messages/") == 1
    # Unmasked headers still filter by value.
    assert listed("Authorization", "").content.count(b"/messages/") == 1
    assert listed("Tenant", "acm").content.count(b"/messages/") == 1
    assert listed("Tenant", "xyz").content.count(b"/messages/") == 0


# -- 2: poison messages ---------------------------------------------------------------------------

def _poison(queue: str, header_text: str, body: bytes = b'{"number": "4111"}') -> None:
    """A row another system wrote whose headers Sluice cannot use (a non-string value, or
    text that is no JSON object): it reads as poison."""
    with connection.cursor() as cursor:
        cursor.execute(dialect().insert_with_expires(queue), [str(uuid.uuid4()), None, None, None, header_text, body])


POISON = json.dumps({"Authorization": POISON_SECRET, "Retries": 3, "NServiceBus.MessageId": "p-1"})


def test_poison_headers_are_masked_on_every_page_and_in_the_api(operator_client, viewer_client, queue,
                                                                 error_queue, masking):
    _poison(queue, POISON)
    status, listed = api(viewer_client, "get", f"/api/queues/{queue}/messages/")
    assert status == 200 and listed["messages"][0]["poison"]
    shown = listed["messages"][0]["raw_headers"]
    assert "POISON-SECRET" not in shown and "Retries" in shown and "***" in shown
    row_version = listed["messages"][0]["row_version"]
    page = viewer_client.get(f"/queues/{queue}/messages/{row_version}/").content.decode()
    assert "POISON-SECRET" not in page and "Retries" in page
    # In the error queue (where the pump moves it, or another system wrote it): a record.
    _poison(error_queue, POISON)
    failures.ingest_errors()
    (record,) = FailedMessage.objects.all()
    for path in (f"/failed/{record.pk}/", f"/failed/{record.pk}/edit/"):
        body = operator_client.get(path).content.decode()
        assert "POISON-SECRET" not in body and "Retries" in body, path
    status, detail = api(viewer_client, "get", f"/api/failed/{record.pk}/")
    assert status == 200 and "Retries" in json.dumps(detail)
    assert "POISON-SECRET" not in json.dumps(detail)


@pytest.mark.parametrize("text", ['{"Authorization": "' + POISON_SECRET + '", ',  # cut short
                                  '[{"Authorization": "' + POISON_SECRET + '"}]', "[" * 3000 + "]" * 3000])
def test_unparsable_raw_headers_are_withheld_when_headers_are_masked(viewer_client, queue, masking, text):
    _poison(queue, text)
    status, listed = api(viewer_client, "get", f"/api/queues/{queue}/messages/")
    assert status == 200 and listed["messages"][0]["poison"]
    assert "POISON-SECRET" not in listed["messages"][0]["raw_headers"]


def test_raw_headers_show_as_they_are_without_masking(viewer_client, queue):
    _poison(queue, "{not json")
    status, listed = api(viewer_client, "get", f"/api/queues/{queue}/messages/")
    assert status == 200 and listed["messages"][0]["raw_headers"] == "{not json"


# -- 3: ids in URLs -------------------------------------------------------------------------------

@pytest.fixture
def crafted(queue, error_queue, outbox, monkeypatch):
    """Every kind of id the pages put in a URL, crafted: delayed messages, outbox records,
    failed messages and conversations.  Returns the ids planted (and the queue's name)."""
    from tests.test_dashboard_pages_actions import stuck_session

    store = delayed_store()
    store.setup_infrastructure()
    for crafted_id in CRAFTED_IDS:
        Transport().send(queue, "later", delay=3600, message_id=crafted_id)
        stuck_session(crafted_id, queue, monkeypatch)
        fail_message(queue, headers={Headers.CONVERSATION_ID: crafted_id}, message_id=f"f-{crafted_id}")
        Transport().send(queue, "{}", headers={Headers.CONVERSATION_ID: crafted_id})
    yield {*CRAFTED_IDS, queue, error_queue}
    for m in store.list(1000)[0]:
        if m.destination == queue:
            store.delete(m.id)


def _pages(queue: str) -> list[str]:
    # /delayed/ for this queue only: the delayed store outlives other tests' database flushes.
    paths = [f"/delayed/?destination={queue}", "/outbox/", "/failed/", f"/failed/?queue={queue}&status=all", f"/queues/{queue}/"]
    paths += [f"/failed/{pk}/" for pk in FailedMessage.objects.values_list("pk", flat=True)]
    paths += [f"/queues/{queue}/messages/{m.row_version}/" for m in Transport().browse(queue, limit=100)]
    return paths


def test_crafted_ids_stay_in_their_own_route(operator_client, crafted, queue):
    checked = 0
    for path in _pages(queue):
        response = operator_client.get(path)
        assert response.status_code == 200, path
        page = response.content.decode()
        found = problems(f"http://testserver{path}", page, crafted)
        assert not found, f"{path}: {found}"
        checked += 1
    from urllib.parse import quote

    for conversation_id in CRAFTED_IDS:  # each conversation's own page, reached from its link
        path = "/conversations/" + quote(conversation_id, safe="") + "/"
        response = operator_client.get(path)
        if response.status_code == 200:
            assert not problems(f"http://testserver{path}", response.content.decode(), crafted), path
    assert checked > len(CRAFTED_IDS)


def test_crafted_ids_reach_their_own_action(operator_client, crafted, queue):
    """A button built from a crafted id acts on that id, and on nothing else."""
    from tests.url_safety import browser_resolve, urls_in

    page = operator_client.get(f"/delayed/?destination={queue}").content.decode()
    deletes = [u for a, u in urls_in(page) if a == "formaction" and u.endswith("/delete/")]
    assert len(deletes) == len(CRAFTED_IDS)
    for url in deletes:
        assert operator_client.post(browser_resolve("http://testserver/delayed/", url)).status_code == 303
    assert [m for m in delayed_store().list(1000)[0] if m.destination == queue] == []


@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40))
@hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_url_leaves_its_route_for_any_id(operator_client, queue, error_queue, outbox, monkeypatch, text):
    from tests.test_dashboard_pages_actions import stuck_session

    store = delayed_store()
    store.setup_infrastructure()
    text = text.strip() or "x"
    try:
        Transport().send(queue, "later", delay=3600, message_id=text)
    except Exception:  # an id Sluice refuses to send never reaches a page
        return
    planted = {text, queue, error_queue}
    try:
        stuck_session(text, queue, monkeypatch)
        # A delayed message another endpoint wrote, whose destination is no queue at all.
        store.store(DelayedMessage(id=f"d-{text}"[:200], destination=text[:200], body=b"", headers={}), delay=3600)
        planted.add(f"d-{text}"[:200])
        fail_message(queue, headers={Headers.CONVERSATION_ID: text, "X-Value": text}, message_id=f"f-{text}"[:200])
        conversations = set()
        from urllib.parse import urlencode

        for path in _pages(queue) + ["/delayed/?" + urlencode({"destination": text[:200]})]:
            response = operator_client.get(path)
            assert response.status_code == 200, path
            page = response.content.decode()
            assert not problems(f"http://testserver{path}", page, planted)
            conversations |= {browser_resolve(f"http://testserver{path}", u) for a, u in urls_in(page)
                              if "/conversations/" in u}
        for url in conversations:  # the conversation's own page, reached by its link
            response = operator_client.get(url)
            assert response.status_code == 200, url
            assert not problems(url, response.content.decode(), planted)
    finally:
        for m in store.list(1000)[0]:
            store.delete(m.id)
        from tests.conftest import clear_outbox

        clear_outbox(outbox)
        FailedMessage.objects.all().delete()


# -- 11: bodies Python cannot load ----------------------------------------------------------------

@pytest.mark.parametrize("body", [b'{"number": "4111-1111", "n": ' + b"9" * 5000 + b"}",
                                  b'{"number": "4111-1111", "deep": ' + b"[" * 3000 + b"]" * 3000 + b"}"])
def test_a_body_python_cannot_load_is_not_shown_when_fields_are_masked(operator_client, viewer_client, queue,
                                                                       error_queue, masking, body):
    # More than the four digits, which turn up by chance in ids and microsecond times; less
    # than the whole value, which a cut-short preview would not show whole.
    SECRET = "4111-"
    Transport().send(queue, body)
    row_version = Transport().browse(queue)[0].row_version
    status, listed = api(viewer_client, "get", f"/api/queues/{queue}/messages/?bodies=1")
    assert status == 200 and SECRET not in json.dumps(listed)
    assert SECRET.encode() not in viewer_client.get(f"/queues/{queue}/messages/{row_version}/").content
    assert SECRET.encode() not in viewer_client.get(f"/queues/{queue}/messages/{row_version}/body").content
    record = fail_message(queue, body)
    for path in (f"/failed/{record.pk}/", f"/failed/{record.pk}/body", f"/failed/{record.pk}/edit/"):
        assert SECRET.encode() not in operator_client.get(path).content, path
    status, detail = api(viewer_client, "get", f"/api/failed/{record.pk}/")
    assert SECRET not in json.dumps(detail)


@given(st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.\-]{0,30}\Z"))
@hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_url_leaves_its_route_for_any_queue_name(operator_client, transactional_db, name):
    """Queue names are checked (core.queues.NAME_RE), so any valid one: its pages' URLs stay
    in their routes too (a name such as "a..b" or "x.-" included)."""
    from core.errors import InvalidQueueName
    from dashboard.counting import stats

    stats.clear_cache()  # the overview's snapshot still lists the previous example's queue
    try:
        create_queue(name)
    except InvalidQueueName:
        return  # a reserved prefix: no such queue can exist
    try:
        Transport().send(name, "{}", headers={"X-Value": name, Headers.CONVERSATION_ID: name})
        row_version = Transport().browse(name)[0].row_version
        for path in ("/", "/partials/overview/", f"/queues/{name}/", f"/queues/{name}/messages/{row_version}/",
                     "/monitoring/", f"/monitoring/{name}/"):
            response = operator_client.get(path)
            assert response.status_code == 200, path
            assert not problems(f"http://testserver{path}", response.content.decode(), {name})
    finally:
        delete_queue(name)
        registry.forget(name)
