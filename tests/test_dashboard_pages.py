"""The dashboard pages through Django's test client: access (anonymous, no role, viewer,
operator), what each page shows, CSRF.  Actions: tests/test_dashboard_pages_actions.py;
hostile message data: tests/test_dashboard_pages_xss.py; in a browser: tests/test_browser_*.py."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from core.delayed import delayed_store
from core.models import BulkOperation, FailedMessage
from core.transport import Transport
from dashboard.models import AuditEntry
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, fail_message, make_user, operator, operator_client, viewer, viewer_client,
)

PAGES = ["/", "/partials/overview/", "/failed/", "/failed/operations/", "/delayed/", "/outbox/", "/audit/"]


@pytest.mark.parametrize("url", PAGES + ["/queues/error/", "/failed/1/"])
def test_anonymous_is_sent_to_the_login_page(client, db, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("url", ["/failed/retry/", "/failed/archive/", "/queues/error/purge/", "/delayed/x/delete/",
                                 "/outbox/x/dispatch/"])
def test_anonymous_actions_go_to_login_and_change_nothing(client, db, url):
    response = client.post(url, {"group": "g"})
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert not AuditEntry.objects.exists()


def test_a_user_without_a_sluice_role_gets_403(client, transactional_db):
    client.force_login(make_user(None))
    for url in PAGES:
        response = client.get(url)
        assert response.status_code == 403, url
        assert b"no Sluice role" in response.content and b"--role viewer|operator" in response.content


def test_unknown_address_is_a_404_page(operator_client):
    response = operator_client.get("/no/such/page/")
    assert response.status_code == 404 and b"There is no page at this address" in response.content


def test_healthz_needs_no_login(client, db):
    assert client.get("/healthz").status_code == 200


def test_login_page_logs_in_and_redirects_to_the_overview(client, operator):
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post("/accounts/login/", {"username": operator.username, "password": "pass-word-123"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200
    wrong = Client().post("/accounts/login/", {"username": operator.username, "password": "nope"})
    assert wrong.status_code == 200 and b"did not match" in wrong.content


def test_logout_is_a_post(operator_client):
    assert operator_client.post("/accounts/logout/").status_code == 302
    assert operator_client.get("/").status_code == 302


@pytest.mark.parametrize("url", PAGES)
def test_every_page_renders_for_a_viewer_with_actions_disabled(viewer_client, error_queue, url):
    response = viewer_client.get(url)
    assert response.status_code == 200, response.content[:500]
    html = response.content.decode()
    if not url.startswith("/partials") and "operations" not in url:
        assert 'data-role="viewer"' in html and "You can look but not act" in html
        assert "htmx" in html and "/static/django_htmx/htmx-2.min.js" in html
        assert "X-CSRFToken" in html


# -- overview ------------------------------------------------------------------------------------

def _row(html: str, marker: str) -> str:
    assert marker in html, f"{marker} not on the page"
    return html.split(marker)[1].split("</tr>")[0]


def test_overview_shows_counts_errors_and_delayed(operator_client, make_queue, error_queue):
    delayed_store().setup_infrastructure()
    name = make_queue()
    transport = Transport()
    transport.send(name, "a")
    transport.send(name, "b")
    transport.send(name, "c", ttl=0)
    transport.send(name, "later", delay=3600)
    fail_message(name)
    html = operator_client.get("/").content.decode()
    row = _row(html, f'data-queue="{name}"')
    assert ">2</td>" in row.split("pending")[1].split("</td>")[0] + "</td>"
    assert 'class="num expired' in row and ">1</td>" in row.split("expired")[1].split("</td>")[0] + "</td>"
    assert f'href="/failed/?queue={name}"' in row  # one unresolved failure, linked
    assert ">1</td>" in row.split("scheduled")[1].split("</td>")[0] + "</td>"
    assert 'data-health="workers"' in html
    # The numbers region polls its own partial, a fragment without the layout.
    assert 'hx-get="/partials/overview/"' in html and "every 3s" in html
    partial = operator_client.get("/partials/overview/").content.decode()
    assert f'data-queue="{name}"' in partial and "<html" not in partial


def test_overview_with_redis_down_says_unknown(operator_client, settings, error_queue):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = operator_client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-health="unknown"' in html and "unknown" in _row(html, 'data-health="workers"') + "</div>"


def test_overview_makes_a_triggered_breaker_impossible_to_miss(operator_client, settings, error_queue):
    import json

    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    key = "sluice:worker:test-host:4242"
    beat = {"name": "test-host:4242", "last_seen": "2026-11-23T10:00:00+00:00", "loops": [],
            "breakers": [{"name": "delayed-fetch", "state": "triggered", "failures": 40,
                          "last_error": "connection refused", "triggered_at": 1.0}]}
    client.setex(key, 30, json.dumps(beat))
    try:
        html = operator_client.get("/").content.decode()
    finally:
        client.delete(key)
    assert 'role="alert" data-alarm="breaker"' in html
    alarm = html.split('data-alarm="breaker"')[1].split("</div>")[0]
    assert "delayed-fetch" in alarm and "test-host:4242" in alarm and "connection refused" in alarm
    assert 'data-breaker="delayed-fetch"' in html


def test_overview_survives_an_unreadable_queue_table(operator_client, make_queue, error_queue):
    from core.queues import dialect

    good, gone = make_queue(), make_queue()
    with connection.cursor() as cursor:
        for sql, params in dialect().drop_queue_table(gone):
            cursor.execute(sql, params)
    response = operator_client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "table unreadable" in _row(html, f'data-queue="{gone}"')
    assert "table unreadable" not in _row(html, f'data-queue="{good}"')


# -- queue page ------------------------------------------------------------------------------------

def test_queue_page_browses_in_fifo_pages_by_row_version(operator_client, queue, monkeypatch):
    from dashboard.views import queues as queue_views

    monkeypatch.setattr(queue_views, "PAGE_SIZE", 3)
    ids = Transport().send_many(queue, [f"m{i}" for i in range(7)], message_type="Ping")
    html = operator_client.get(f"/queues/{queue}/").content.decode()
    shown = [i for i in ids if i in html]
    assert shown == ids[:3]
    next_url = html.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0].replace("&amp;", "&")
    assert "after=" in next_url and "offset" not in next_url
    page2 = operator_client.get(f"/queues/{queue}/{next_url}").content.decode()
    assert [i for i in ids if i in page2] == ids[3:6]


def test_queue_filters_are_get_parameters(operator_client, queue):
    transport = Transport()
    ping = transport.send(queue, "p", message_type="Ping", headers={"Tenant": "acme"})
    pong = transport.send(queue, "q", message_type="Pong", headers={"Tenant": "other"})
    expired = transport.send(queue, "x", message_type="Ping", ttl=0)
    by_type = operator_client.get(f"/queues/{queue}/?type=Pong").content.decode()
    assert pong in by_type and ping not in by_type
    by_header = operator_client.get(f"/queues/{queue}/?header=Tenant&value=acme").content.decode()
    assert ping in by_header and pong not in by_header
    only_expired = operator_client.get(f"/queues/{queue}/?expired=only").content.decode()
    assert expired in only_expired and ping not in only_expired
    live = operator_client.get(f"/queues/{queue}/?expired=exclude").content.decode()
    assert expired not in live and ping in live
    old = operator_client.get(f"/queues/{queue}/?min_age=60").content.decode()
    assert ping not in old and "No message matches this filter" in old


def test_message_detail_pretty_prints_json_and_truncates_big_bodies(operator_client, queue):
    transport = Transport()
    transport.send(queue, {"order": 7, "lines": [1, 2]})
    transport.send(queue, "x" * 70_000)
    rows = transport.browse(queue)
    small = operator_client.get(f"/queues/{queue}/messages/{rows[0].row_version}/").content.decode()
    assert "&quot;order&quot;: 7,\n  &quot;lines&quot;: [" in small and "JSON" in small
    big = operator_client.get(f"/queues/{queue}/messages/{rows[1].row_version}/").content.decode()
    assert "truncated" in big and "x" * 65_536 in big and "x" * 65_537 not in big
    download = operator_client.get(f"/queues/{queue}/messages/{rows[1].row_version}/body")
    assert download.status_code == 200 and download.content == b"x" * 70_000
    assert download["Content-Type"] == "application/octet-stream" and "attachment" in download["Content-Disposition"]
    assert download["X-Content-Type-Options"] == "nosniff"


def test_unknown_queue_and_vanished_message_are_404_pages(operator_client, queue):
    assert operator_client.get("/queues/nope_nope/").status_code == 404
    missing = operator_client.get(f"/queues/{queue}/messages/999999/")
    assert missing.status_code == 404 and b"no longer in the queue" in missing.content


# -- failed messages -------------------------------------------------------------------------------

def test_failed_page_shows_groups_by_exception_type_and_queue(operator_client, make_queue, error_queue):
    orders, billing = make_queue(), make_queue()
    for _ in range(3):
        fail_message(orders, exception_type="ValueError", frame="place")
    fail_message(billing, exception_type="KeyError", frame="bill", message_type="BillOrder")
    html = operator_client.get("/failed/").content.decode()
    groups = html.split('id="groups"')[1].split("</table>")[0]
    assert "ValueError @ shop/handlers.py:place" in groups and "KeyError @ shop/handlers.py:bill" in groups
    value_row = _row(groups, "ValueError @")
    assert ">3</span>" in value_row and "<time" in value_row and 'title="' in value_row
    by_queue = operator_client.get("/failed/?by=queue").content.decode().split('id="groups"')[1].split("</table>")[0]
    assert orders in by_queue and billing in by_queue
    by_type = operator_client.get("/failed/?by=message_type").content.decode().split('id="groups"')[1]
    assert "BillOrder" in by_type.split("</table>")[0]


def test_failed_search_by_text_exception_id_queue_and_dates(operator_client, make_queue, error_queue):
    import datetime as dt

    q = make_queue()
    old = fail_message(q, exception_type="TimeoutError", exception_message="db slow",
                       failed_at=dt.datetime(2026, 1, 5, tzinfo=dt.timezone.utc))
    new = fail_message(q, exception_type="ValueError", exception_message="bad sku 42")

    def ids(query: str) -> set[str]:
        html = operator_client.get(f"/failed/?status=all&{query}").content.decode()
        table = html.split('id="failures"')[1].split("</table>")[0]
        return {r.message_id for r in (old, new) if r.message_id in table}

    assert ids("q=sku") == {new.message_id}
    assert ids("exception=Timeout") == {old.message_id}
    assert ids(f"message_id={old.message_id}") == {old.message_id}
    assert ids(f"queue={q}") == {old.message_id, new.message_id}
    assert ids("since=2026-01-01&until=2026-02-01") == {old.message_id}
    assert ids("q=nothing-like-this") == set()


def test_failed_detail_shows_trace_headers_body_and_history(operator_client, queue, error_queue):
    record = fail_message(queue, body='{"sku": "A-1"}', headers={"Tenant": "acme"})
    html = operator_client.get(f"/failed/{record.pk}/").content.decode()
    assert 'data-trace>Traceback (most recent call last):' in html
    assert "Tenant" in html and "acme" in html and "&quot;sku&quot;: &quot;A-1&quot;" in html
    history = html.split('id="history"')[1]
    assert ">failed</span>" in history
    assert f'href="/failed/{record.pk}/edit/"' in html
    body = operator_client.get(f"/failed/{record.pk}/body")
    assert body.content == b'{"sku": "A-1"}' and body["Content-Type"] == "application/octet-stream"
    assert operator_client.get("/failed/999999/").status_code == 404


def test_edit_form_locks_protected_headers(operator_client, queue, error_queue):
    record = fail_message(queue, headers={"Tenant": "acme"})
    html = operator_client.get(f"/failed/{record.pk}/edit/").content.decode()
    table = html.split('id="edit-headers"')[1].split("</table>")[0]
    locked = [part.split("</th>")[0] for part in table.split('<tr class="locked"><th scope="row">')[1:]]
    assert "NServiceBus.MessageId" in locked and "NServiceBus.CorrelationId" in locked
    assert 'value="Tenant"' in table and 'value="acme"' in table
    assert 'value="NServiceBus.MessageId"' not in table  # not editable
    assert "NServiceBus.ExceptionInfo" not in table  # failure headers are not part of the copy


def test_operations_region_polls_only_while_an_operation_runs(operator_client, queue, error_queue):
    from core import failures

    record = fail_message(queue)
    op = failures.retry([record.message_id], requested_by="someone")
    running = operator_client.get("/failed/operations/").content.decode()
    assert 'hx-trigger="every 1s"' in running and f'data-operation="{op.pk}"' in running
    assert 'role="progressbar"' in running and 'aria-valuenow="0"' in running
    failures.run_operation(op.pk)
    done = operator_client.get("/failed/operations/").content.decode()
    assert "hx-trigger" not in done and 'data-status="finished"' in done and "1 done" in done
    assert BulkOperation.objects.get(pk=op.pk).done == 1


# -- delayed, outbox, audit ---------------------------------------------------------------------------

def test_delayed_page_lists_by_due_time_and_filters_by_destination(operator_client, make_queue):
    delayed_store().setup_infrastructure()
    a, b = make_queue(), make_queue()
    transport = Transport()
    later = transport.send(a, "later", delay=7200)
    sooner = transport.send(a, "sooner", delay=600)
    other = transport.send(b, "other", delay=900)
    try:
        html = operator_client.get("/delayed/").content.decode()
        table = html.split('id="delayed"')[1]
        assert table.index(sooner) < table.index(other) < table.index(later)
        assert "scheduled" in table and "in 10 min" in table
        only_b = operator_client.get(f"/delayed/?destination={b}").content.decode().split('id="delayed"')[1]
        assert other in only_b and sooner not in only_b
    finally:
        store = delayed_store()
        for m in store.list(1000)[0]:
            if m.destination in (a, b):
                store.delete(m.id)


def test_outbox_page_shows_undispatched_records_and_size(operator_client, outbox, queue, monkeypatch):
    from core.outbox import OutboxSession
    from tests.test_dashboard_pages_actions import stuck_session

    with OutboxSession(message_id="order-1-placed") as session:
        session.send(queue, {"x": 1})
    stuck_session("stuck-1", queue, monkeypatch)
    html = operator_client.get("/outbox/").content.decode()
    assert 'data-outbox="stuck-1"' in html and 'data-outbox="order-1-placed"' not in html
    row = _row(html, 'data-outbox="stuck-1"')
    assert queue in row and "<time" in row and "waiting" in row
    assert "Storage" in html and "Undispatched" in html


def test_audit_page_filters_by_user_action_and_date(operator_client, operator, viewer, queue):
    transport = Transport()
    mid = transport.send(queue, "a")
    other = Client()
    other.force_login(viewer)
    other.post(f"/queues/{queue}/delete/", {"ids": [mid]})  # denied, recorded
    operator_client.post(f"/queues/{queue}/delete/", {"ids": [mid]})
    html = operator_client.get("/audit/").content.decode()
    assert html.count("data-audit=") == 2
    mine = operator_client.get(f"/audit/?user={operator.username}").content.decode()
    assert mine.count("data-audit=") == 1 and ">ok</span>" in mine
    denied = operator_client.get(f"/audit/?user={viewer.username}&action=delete_messages").content.decode()
    assert denied.count("data-audit=") == 1 and ">denied</span>" in denied
    assert operator_client.get("/audit/?since=2000-01-01&until=2000-01-02").content.decode().count("data-audit=") == 0


# -- CSRF ----------------------------------------------------------------------------------------------

def test_actions_without_a_csrf_token_are_refused_and_change_nothing(operator, queue, error_queue):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    mid = Transport().send(queue, "keep me")
    record = fail_message(queue)
    for url, data in [(f"/queues/{queue}/delete/", {"ids": [mid]}), (f"/queues/{queue}/purge/", {"confirm": queue}),
                      ("/failed/retry/", {"ids": [record.pk]}), ("/failed/delete/", {"ids": [record.pk]})]:
        assert client.post(url, data).status_code == 403, url
    assert [m.id for m in Transport().browse(queue)]
    assert FailedMessage.objects.filter(pk=record.pk, status="unresolved").exists()
    assert not AuditEntry.objects.exists()
    # With the token (as the page's forms and htmx header send it) the same request works.
    page = client.get(f"/queues/{queue}/")
    token = page.cookies["csrftoken"].value
    response = client.post(f"/queues/{queue}/delete/", {"ids": [Transport().browse(queue)[0].id]},
                           HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 303


def test_queue_page_of_an_unreadable_table_renders_with_the_error(operator_client, make_queue):
    from core.queues import dialect

    name = make_queue()
    with connection.cursor() as cursor:
        for sql, params in dialect().drop_queue_table(name):
            cursor.execute(sql, params)
    response = operator_client.get(f"/queues/{name}/")
    assert response.status_code == 200 and b"The queue table cannot be read" in response.content
    assert operator_client.get("/").status_code == 200
