"""The conversation view: a conversation's messages from the processing records and failed
messages (core.records.conversations), its flow tree, timeline and sequence (dashboard), its pages
of newest entries with what is older said and linked, the search, and the JSON API.

A real conversation is made by real pumps and handlers; the shapes the pumps do not make
on demand (clock skew, 10,000 messages, a related-to loop) are written as records."""
from __future__ import annotations

import datetime as dt
import importlib
import json
import uuid

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test import Client

from core import failures
from core.records import conversations
from core.messages import Headers
from core.models import FailedMessage
from core.models.records import ProcessingRecord
from core.transport import Transport
from dashboard.conversation.flow import flow_rows
from tests.conftest import drain
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, fail_message, operator, operator_client, viewer, viewer_client,
)

T0 = 1_790_000_000_000_000  # µs: 2026-09-21


def record(cid: str, mid: str, *, related_to: str | None = None, message_type: str = "PlaceOrder",
           queue: str = "orders", sent: int = 0, started: int = 1000, ended: int = 3000,
           deliver_at: int | None = None, outcome: str = "processed", intent: str = "send",
           attempt: int = 1) -> ProcessingRecord:
    """One processing record, times in µs after T0."""
    return ProcessingRecord(
        message_id=mid, message_type=message_type, queue=queue, endpoint=queue, time_sent_us=T0 + sent,
        started_us=T0 + started, ended_us=T0 + ended, outcome=outcome, attempt=attempt,
        deliver_at_us=None if deliver_at is None else T0 + deliver_at, conversation_id=cid,
        related_to=related_to, correlation_id=mid, intent=intent, originating_endpoint="shop",
        originating_host="web-1", worker="worker-1:42")


def new_id() -> str:
    return f"conv-{uuid.uuid4().hex[:12]}"


# -- a real conversation -----------------------------------------------------------------------

@pytest.fixture
def fast_pump(pump_for):
    return lambda queue: pump_for(queue, immediate_retries=0, concurrency=1)


def test_a_handlers_send_and_its_failure_make_one_conversation(transport, make_queue, fast_pump, temp_handlers,
                                                                error_queue):
    """orders' handler sends to billing, whose handler fails: the failed message keeps the
    conversation, its parent and correlation id as columns, and the page shows billing under
    orders, failed, with its failed-message record to retry."""
    orders, billing = make_queue(), make_queue()
    temp_handlers(orders, None, lambda m, c: c.send(billing, {"bill": 1}, message_type="BillOrder"))

    def fail(message, context):
        raise ValueError("no tax rate")

    temp_handlers(billing, None, fail)
    first = transport.send(orders, {"order": 1}, message_type="PlaceOrder", correlation_id="order-42")
    drain(fast_pump(orders))
    drain(fast_pump(billing))
    assert failures.ingest_errors() == 1
    failed = FailedMessage.objects.get(original_queue=billing)
    placed = ProcessingRecord.objects.get(message_id=first)
    assert failed.conversation_id == placed.conversation_id != ""
    assert failed.related_to == first and failed.correlation_id

    assert conversations.find(first) == placed.conversation_id
    assert conversations.find(failed.message_id) == placed.conversation_id
    assert conversations.find(failed.correlation_id) == placed.conversation_id
    found = conversations.page(placed.conversation_id)
    (root,) = found.roots
    assert root.message_id == first and root.message_type == "PlaceOrder" and root.outcome == "processed"
    (child,) = root.children
    assert child.message_id == failed.message_id and child.queue == billing
    assert child.failed and child.retryable and child.failed_pk == failed.pk
    assert child.outcome == "failed" and child.wait_us is not None and child.wait_us >= 0


# -- the graph -----------------------------------------------------------------------------------

def test_flow_timeline_and_where_the_time_went(transactional_db):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([
        record(cid, "a", sent=0, started=1_000, ended=5_000),
        record(cid, "b", related_to="a", message_type="BillOrder", queue="billing", sent=4_000,
               started=6_000, ended=9_000),
        # Delayed 60 s, waited 2 ms after it was due, processed in 1 ms.
        record(cid, "c", related_to="a", message_type="ShipOrder", queue="shipping", sent=4_500,
               deliver_at=60_004_500, started=60_006_500, ended=60_007_500, intent="delayed"),
        record(cid, "d", related_to="c", message_type="Notify", queue="mail", sent=60_007_000,
               started=60_010_000, ended=60_011_000, intent="reply"),
        record("other", "x", sent=0),
    ])
    found = conversations.page(cid)
    assert [n.message_id for n in found.nodes] == ["a", "b", "c", "d"]
    (a,) = found.roots
    assert [n.message_id for n in a.children] == ["b", "c"]
    c = a.children[1]
    assert [n.message_id for n in c.children] == ["d"]
    assert (c.delayed_us, c.wait_us, c.processing_us) == (60_000_000, 2_000, 1_000)
    assert (a.delayed_us, a.wait_us, a.processing_us) == (None, 1_000, 4_000)
    assert not found.skewed and found.next_cursor is None and found.older == 0
    assert [(r.depth, r.node.message_id) for r in flow_rows(found.roots)] == [(0, "a"), (1, "b"), (1, "c"), (2, "d")]


def test_a_negative_duration_is_clock_skew(transactional_db, viewer_client):
    cid = new_id()
    # Sent "after" it was handled: the sender's clock runs ahead of the worker's.
    ProcessingRecord.objects.bulk_create([record(cid, "early", sent=5_000, started=1_000, ended=2_000)])
    (node,) = conversations.page(cid).nodes
    assert node.wait_us == -4_000 and node.skewed
    html = viewer_client.get(f"/conversations/{cid}/").content.decode()
    assert "data-skew-warning" in html and "Clock skew" in html and 'data-skew="1"' in html


def test_an_operators_retry_is_the_same_node_no_longer_failed(transactional_db):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([
        record(cid, "m", started=1_000, ended=2_000, outcome="retried"),
        record(cid, "m", started=3_000, ended=4_000, outcome="failed", attempt=2),
        record(cid, "m", started=90_000, ended=91_000, outcome="processed", intent="retry"),
    ])
    (node,) = conversations.page(cid).nodes
    assert node.records == 3 and node.outcome == "processed" and node.intent == "retry" and not node.failed


def test_paging_draws_the_newest_and_says_how_many_are_older(transactional_db, viewer_client, error_queue):
    """12 records and a failure, 5 a page: every entry on exactly one page, newest first,
    the count of older ones on each, the last page without a cursor."""
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, f"m{i:02}", sent=i * 10_000, started=i * 10_000 + 1,
                                                 ended=i * 10_000 + 2) for i in range(12)])
    fail_message("orders", message_id="lost", headers={Headers.CONVERSATION_ID: cid},
                 failed_at=dt.datetime.fromtimestamp((T0 + 55_000) / 1e6, dt.timezone.utc))
    seen, olders, cursor = [], [], None
    while True:
        found = conversations.page(cid, limit=5, cursor=cursor)
        seen += [n.message_id for n in found.nodes]
        olders.append(found.older)
        cursor = found.next_cursor
        if cursor is None:
            break
    assert olders == [8, 3, 0]
    assert sorted(seen) == sorted([f"m{i:02}" for i in range(12)] + ["lost"]) and len(seen) == 13
    assert seen[:5] == ["m07", "m08", "m09", "m10", "m11"]  # each page oldest first
    assert "lost" in seen[5:10]

    with pytest.raises(conversations.BadCursor):
        conversations.page(cid, cursor="not-a-cursor")


def test_the_page_says_n_more_and_links_them(transactional_db, viewer_client, settings):
    settings.SLUICE_CONVERSATION_PAGE = 4
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, f"m{i}", sent=i, started=i + 1, ended=i + 2)
                                          for i in range(10)])
    response = viewer_client.get(f"/conversations/{cid}/")
    html = response.content.decode()
    assert response.status_code == 200
    assert 'data-more' in html and "6 more older entries" in html and 'rel="next"' in html
    older = html.split('data-more')[1].split('href="')[1].split('"')[0].replace("&amp;", "&")
    html2 = viewer_client.get(older).content.decode()
    assert "2 more older entries" in html2 and ">Newest<" in html2
    assert viewer_client.get(f"/conversations/{cid}/?cursor=garbage").status_code == 400


def test_ten_thousand_messages_stay_one_page_at_a_time(transactional_db, viewer_client, settings):
    """A conversation of 10,000 messages: the page draws the newest SLUICE_CONVERSATION_PAGE,
    counts the rest, and a long related-to chain is drawn without recursion."""
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, f"m{i}", related_to=f"m{i - 1}" if i else None,
                                                 sent=i * 10, started=i * 10 + 1, ended=i * 10 + 2)
                                          for i in range(10_000)], batch_size=2000)
    found = conversations.page(cid)
    assert len(found.nodes) == 200 and found.older == 9_800
    rows = flow_rows(found.roots)
    assert rows[-1].depth == 199 and rows[-1].deep and rows[0].node.parent_elsewhere
    response = viewer_client.get(f"/conversations/{cid}/")
    assert response.status_code == 200 and "9800 more older entries" in response.content.decode()


def test_related_to_loops_and_self_references_draw_every_node_once(transactional_db):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([
        record(cid, "a", related_to="b", sent=0), record(cid, "b", related_to="a", sent=10),
        record(cid, "self", related_to="self", sent=20),
    ])
    found = conversations.page(cid)
    drawn = [r.node.message_id for r in flow_rows(found.roots)]
    assert sorted(drawn) == ["a", "b", "self"]


def test_collapse_by_message_type_keeps_failed_members_in_reach(transactional_db, error_queue):
    cid = new_id()
    ProcessingRecord.objects.bulk_create(
        [record(cid, "root", sent=0)]
        + [record(cid, f"n{i}", related_to="root", message_type="Notify", sent=10 + i) for i in range(7)]
        + [record(cid, "bill", related_to="root", message_type="BillOrder", sent=30)])
    fail_message("mail", message_id="n3", message_type="Notify",
                 headers={Headers.CONVERSATION_ID: cid, Headers.RELATED_TO: "root"})
    found = conversations.page(cid)
    rows = flow_rows(found.roots, collapse=True)
    group = next(r for r in rows if r.node is None)
    assert (group.group_type, group.group_count, group.group_failed) == ("Notify", 7, 1)
    assert [n.message_id for n in group.shown] == ["n3"] and group.shown[0].retryable
    assert len(rows) == 4  # root, the group, its failed member, bill
    assert len(flow_rows(found.roots, collapse=False)) == 9


# -- the pages -------------------------------------------------------------------------------------

def test_the_page_draws_flow_timeline_and_sequence_with_a_retry_on_the_failed_node(operator_client, viewer_client,
                                                                                   error_queue):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, "root", sent=0),
                                          record(cid, "ok", related_to="root", queue="billing", sent=10)])
    failed = fail_message("shipping", message_id="bad", message_type="ShipOrder",
                          headers={Headers.CONVERSATION_ID: cid, Headers.RELATED_TO: "root"})
    html = operator_client.get(f"/conversations/{cid}/").content.decode()
    assert 'class="conversation-timeline"' in html and 'class="conversation-sequence"' in html
    assert 'data-lane="orders"' in html and 'data-lane="billing"' in html and 'data-lane="shipping"' in html
    row = html.split('data-message="bad"')[1].split("</tr>")[0]
    assert 'class="failed' in row and 'action="/failed/retry/"' in row and f'value="{failed.pk}"' in row
    assert f'href="/failed/{failed.pk}/"' in row and "disabled" not in row
    assert f'href="/failed/{failed.pk}/"' in html.split('class="conversation-sequence"')[1]  # the node links
    viewer_row = viewer_client.get(f"/conversations/{cid}/").content.decode().split('data-message="bad"')[1]
    assert "disabled" in viewer_row.split("</tr>")[0]
    # Reached from the failed message's page and the failed list.
    assert f'href="/conversations/{cid}/"' in operator_client.get(f"/failed/{failed.pk}/").content.decode()
    assert f'href="/conversations/{cid}/"' in operator_client.get("/failed/?status=all&message_id=bad").content.decode()


def test_a_queued_message_links_its_conversation(viewer_client, queue):
    Transport().send(queue, {"order": 1})
    (m,) = Transport().browse(queue)
    html = viewer_client.get(f"/queues/{queue}/messages/{m.row_version}/").content.decode()
    assert f'href="/conversations/{m.headers[Headers.CONVERSATION_ID]}/"' in html


def test_the_search_resolves_ids_to_the_conversation(viewer_client, error_queue):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, "msg-1")])
    fail_message("orders", message_id="msg-2", headers={Headers.CONVERSATION_ID: cid,
                                                        Headers.CORRELATION_ID: "order-42"})
    for term in (cid, "msg-1", "msg-2", "order-42"):
        response = viewer_client.get("/conversations/", {"q": term})
        assert response.status_code == 302 and response["Location"] == f"/conversations/{cid}/"
    missing = viewer_client.get("/conversations/", {"q": "nothing-like-it"})
    assert missing.status_code == 200 and "data-not-found" in missing.content.decode()
    assert viewer_client.get("/conversations/", {"q": "x" * 300}).status_code == 400
    assert viewer_client.get("/conversations/", {"q": "a\x00b"}).status_code == 400
    assert viewer_client.get("/conversations/a%00b/").status_code == 400
    empty = viewer_client.get("/conversations/nothing-here/")
    assert empty.status_code == 200 and "data-empty" in empty.content.decode()


def test_hostile_message_data_stays_inert_in_the_pictures(viewer_client):
    cid = new_id()
    ProcessingRecord.objects.bulk_create([record(cid, '"><script>x()</script>', message_type="<img src=x>",
                                                 queue="<b>q</b>")])
    html = viewer_client.get(f"/conversations/{cid}/").content.decode()
    assert "<script>x()" not in html and "<img src=x>" not in html and "<b>q</b>" not in html


def test_anonymous_users_go_to_the_login(client, transactional_db):
    response = client.get("/conversations/anything/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


# -- the API ----------------------------------------------------------------------------------------

def test_api_pages_a_conversation(viewer_client):
    cid = new_id()
    ProcessingRecord.objects.bulk_create(
        [record(cid, "a", sent=0, started=1_000, ended=3_000),
         record(cid, "b", related_to="a", sent=2_000, deliver_at=10_000, started=12_000, ended=13_000,
                intent="delayed")])
    status, body = api(viewer_client, "get", f"/api/conversations/{cid}/")
    assert status == 200 and body["conversation_id"] == cid and body["next_cursor"] is None
    a, b = body["messages"]
    assert a["message_id"] == "a" and a["wait_ms"] == 1.0 and a["processing_ms"] == 2.0 and not a["parent_on_page"]
    assert b["related_to"] == "a" and b["parent_on_page"] and b["delayed_ms"] == 8.0 and b["wait_ms"] == 2.0
    assert b["intent"] == "delayed" and b["time_sent"].startswith("2026-09-21")

    status, first = api(viewer_client, "get", f"/api/conversations/{cid}/?limit=1")
    assert status == 200 and [m["message_id"] for m in first["messages"]] == ["b"] and first["older"] == 1
    status, second = api(viewer_client, "get", f"/api/conversations/{cid}/?limit=1&cursor={first['next_cursor']}")
    assert [m["message_id"] for m in second["messages"]] == ["a"] and second["next_cursor"] is None

    assert api(viewer_client, "get", f"/api/conversations/{cid}/?cursor=nope")[0] == 400
    assert api(viewer_client, "get", f"/api/conversations/{cid}/?limit=0")[0] == 400
    status, body = api(viewer_client, "get", "/api/conversations/no-such-thing/")
    assert status == 404 and body["error"]
    status, body = api(viewer_client, "get", "/api/conversations/?q=b")
    assert status == 200 and body == {"conversation_id": cid}
    assert api(viewer_client, "get", "/api/conversations/?q=unknown")[0] == 404
    assert api(viewer_client, "get", "/api/conversations/")[0] == 400
    assert api(Client(), "get", f"/api/conversations/{cid}/")[0] in (401, 403)


def test_api_failed_messages_carry_their_conversation(viewer_client, error_queue):
    cid = new_id()
    fail_message("orders", message_id="f-9", headers={Headers.CONVERSATION_ID: cid})
    status, body = api(viewer_client, "get", "/api/failed/?message_id=f-9")
    assert status == 200 and body["results"][0]["conversation_id"] == cid


# -- the migration and the query plan -----------------------------------------------------------------

def test_the_migration_fills_failed_messages_ingested_before_it(error_queue):
    record_ = fail_message("orders", message_id="old-1",
                           headers={Headers.CONVERSATION_ID: "c-old", Headers.RELATED_TO: "p-old"})
    FailedMessage.objects.filter(pk=record_.pk).update(conversation_id="", related_to="", correlation_id="")
    FailedMessage.objects.create(message_id="poison", headers="not json", time_of_failure=record_.time_of_failure,
                                 first_failed_at=record_.time_of_failure, last_failed_at=record_.time_of_failure)
    migration = importlib.import_module("core.migrations.0010_failed_conversation")

    class Editor:
        connection = connection

    migration.fill_conversations(django_apps, Editor())
    filled = FailedMessage.objects.get(pk=record_.pk)
    assert (filled.conversation_id, filled.related_to, filled.correlation_id) == ("c-old", "p-old", "old-1")
    assert FailedMessage.objects.get(message_id="poison").conversation_id == ""


def test_postgresql_reads_a_conversation_from_its_index(transactional_db):
    """EXPLAIN: a page of a conversation and its failures are index ranges (no scan of the
    table), among 20,000 records of 2,000 conversations."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    ProcessingRecord.objects.bulk_create([record(f"c{i % 2000}", f"m{i}", sent=i, started=i, ended=i)
                                          for i in range(20_000)], batch_size=5000)
    with connection.cursor() as cur:
        cur.execute("ANALYZE sluice_processing_record")
        cur.execute("ANALYZE sluice_failed_message")
    records = conversations.newest_records("c7", 200, (T0 + 10_000, 1, 10_000))
    sql, params = records.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = json.dumps(cur.fetchone()[0])
    assert "sluice_prec_conversation" in plan and "Seq Scan" not in plan, plan
    search = ProcessingRecord.objects.filter(message_id="m77").values_list("conversation_id", flat=True)[:1]
    sql, params = search.query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        plan = json.dumps(cur.fetchone()[0])
    assert "sluice_prec_message" in plan and "Seq Scan" not in plan, plan
