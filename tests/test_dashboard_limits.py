"""The dashboard under big data and hostile input (issue 20 items 1, 2, 5, 6, 7, 12): lists
read sizes, never bodies; bodies over the API are opt-in and capped; deep JSON, ids holding
"/", odd delayed destinations and far dates answer pages, not 500s; API actions keep the
throughput samples.  Real database and Redis, Django's test client."""
from __future__ import annotations

import re

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from core.conf import get_settings
from core.scheduling import DelayedMessage
from core.transport import Transport
from dashboard.counting import stats
from tests.dashboard_api_support import api, clean_broker  # noqa: F401 — fixture
from tests.test_dashboard_api import delayed  # noqa: F401 — fixture
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, fail_message, operator, operator_client, viewer, viewer_client,
)

MIB = 1024 * 1024
#: A body column's length (what a listing may read) and the column itself (what it must not).
BODY_LENGTH = re.compile(r'(OCTET_LENGTH|LENGTH|DATALENGTH)\(["\[](Body|State)["\]]\)')
BODY = re.compile(r'["\[](Body|State)["\]]')


def body_reads(queries) -> list[str]:
    """SELECTs whose column list has a Body / State column itself (not its length)."""
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")
            and BODY.search(BODY_LENGTH.sub("", q["sql"].split(" FROM ")[0]))]


@pytest.fixture
def big_queue(make_queue) -> str:
    name = make_queue()
    transport = Transport()
    for i in range(6):
        transport.send(name, b"x" * (4 * MIB - 1024), message_id=f"big-{i}")
    return name


# -- item 1: lists select lengths ---------------------------------------------------------------

def test_queue_page_of_4_mib_bodies_reads_no_body(operator_client, big_queue):
    db = connections[get_settings().DATABASE]
    with CaptureQueriesContext(db) as queries:
        response = operator_client.get(f"/queues/{big_queue}/")
    assert response.status_code == 200
    assert body_reads(queries.captured_queries) == []
    assert "4.0 MB" in response.content.decode()
    assert len(response.content) < 200_000


def test_api_lists_sizes_and_gives_bodies_only_when_asked_within_the_byte_cap(operator_client, big_queue,
                                                                               settings):
    db = connections[get_settings().DATABASE]
    with CaptureQueriesContext(db) as queries:
        response = operator_client.get(f"/api/queues/{big_queue}/messages/?limit=500")
    assert response.status_code == 200
    assert body_reads(queries.captured_queries) == []
    assert len(response.content) < 50_000
    listed = response.json()["messages"]
    assert [m["size"] for m in listed] == [4 * MIB - 1024] * 6
    assert all(m["body"] is None and m["body_base64"] is None and not m["body_included"] for m in listed)

    # Asked for: as many as fit SLUICE_DASHBOARD_API_BODY_BYTES (default 8 MiB: two), then next_after.
    status, page = api(operator_client, "get", f"/api/queues/{big_queue}/messages/?limit=500&bodies=1")
    assert status == 200
    assert len(page["messages"]) == 2 and all(m["body_included"] for m in page["messages"])
    assert page["messages"][0]["body"] == "x" * (4 * MIB - 1024)
    status, rest = api(operator_client, "get",
                       f"/api/queues/{big_queue}/messages/?limit=500&bodies=1&after={page['next_after']}")
    assert [m["id"] for m in rest["messages"]] != [m["id"] for m in page["messages"]]
    assert len(rest["messages"]) == 2


def test_delayed_page_and_api_read_no_state(operator_client, make_queue, delayed):
    queue = make_queue()
    Transport().send(queue, b"y" * (2 * MIB), delay=3600)
    db = connections[get_settings().DATABASE]
    with CaptureQueriesContext(db) as queries:
        assert operator_client.get("/delayed/").status_code == 200
        status, data = api(operator_client, "get", "/api/delayed/")
    assert status == 200 and queue in [m["destination"] for m in data["delayed"]]
    assert body_reads(queries.captured_queries) == []


# -- item 5: deeply nested JSON --------------------------------------------------------------------

def test_deeply_nested_json_body_shows_on_the_detail_pages(operator_client, make_queue, error_queue):
    queue = make_queue()
    deep = "[" * 100_000 + "]" * 100_000
    record = fail_message(queue, body=deep)
    response = operator_client.get(f"/failed/{record.pk}/")
    assert response.status_code == 200
    assert "[[[[" in response.content.decode()
    Transport().send(queue, deep)
    row_version = Transport().browse(queue, limit=1)[0].row_version
    assert operator_client.get(f"/queues/{queue}/messages/{row_version}/").status_code == 200


# -- item 7: ids with "/", delayed destinations, far dates, throughput samples --------------------

def test_message_ids_holding_a_slash_can_be_acted_on_from_the_api(operator_client, make_queue):
    a, b = make_queue(), make_queue()
    transport = Transport()
    transport.send(a, "one", message_id="order/42")
    transport.send(a, "two", message_id="order/43")
    status, data = api(operator_client, "post", f"/api/queues/{a}/messages/order/42/move/", {"to": b})
    assert status == 200, data
    assert [m.headers["NServiceBus.MessageId"] for m in transport.browse(b)] == ["order/42"]
    status, data = api(operator_client, "delete", f"/api/queues/{a}/messages/order/43/")
    assert status == 200 and data == {"deleted": 1}
    assert transport.browse(a) == []


def test_delayed_ids_and_destinations_holding_a_slash_or_empty(operator_client, delayed):
    delayed.store(DelayedMessage(id="odd/1", destination="", body=b"", headers={}), delay=3600)
    delayed.store(DelayedMessage(id="odd/2", destination="a/b", body=b"", headers={}), delay=3600)
    response = operator_client.get("/delayed/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "(no destination)" in html and "a/b" in html
    assert 'formaction="/delayed/odd~2F1/deliver-now/"' in html  # one segment: no id leaves its route
    assert operator_client.post("/delayed/odd/1/delete/").status_code == 303
    status, data = api(operator_client, "post", "/api/delayed/odd/2/deliver-now/")
    assert status == 200 and data == {"delivered": 1}
    status, data = api(operator_client, "delete", "/api/delayed/odd/2/")
    assert status == 200 and data == {"deleted": 1}
    assert delayed.list(10)[0] == []


def test_audit_until_the_last_day_there_is(operator_client):
    assert operator_client.get("/audit/?until=9999-12-31").status_code == 200
    assert operator_client.get("/audit/?since=9999-12-31&until=9999-12-31").status_code == 200


def test_api_actions_keep_the_throughput_samples(operator_client, make_queue):
    queue = make_queue()
    transport = Transport()
    transport.send(queue, "a", message_id="keep-1")
    stats.snapshot(max_age=0)
    samples = stats._cache_get(stats.SAMPLES_KEY)
    assert samples
    status, _ = api(operator_client, "delete", f"/api/queues/{queue}/messages/keep-1/")
    assert status == 200
    assert stats._cache_get(stats.SAMPLES_KEY) == samples


def test_every_dialect_lists_lengths_not_bodies():
    """SQL Server cannot run here: its listing statements are checked as text."""
    from core.dialects import MSSQLDialect, PostgreSQLDialect, SQLiteDialect

    for dialect, fn in ((PostgreSQLDialect(), "OCTET_LENGTH"), (SQLiteDialect(), "LENGTH"),
                        (MSSQLDialect(), "DATALENGTH")):
        for sql in (dialect.browse_sizes("orders"), dialect.delayed_list("sluice_delayed", bodies=False)):
            assert f"{fn}(" in sql and not BODY.search(BODY_LENGTH.sub("", sql.split(" FROM ")[0])), sql


# -- item 6: edit and retry keeps untouched bytes; size limit is the message limit ---------------

def _copy_of(queue: str) -> bytes:
    (copy,) = Transport().browse(queue)
    return copy.body


def test_edit_form_keeps_a_leading_newline_for_the_browser_to_eat(operator_client, make_queue, error_queue):
    record = fail_message(make_queue(), body="\nfirst line\r\nsecond\r\n")
    html = operator_client.get(f"/failed/{record.pk}/edit/").content.decode()
    assert '<textarea id="body" name="body" rows="14" spellcheck="false">\n\nfirst line' in html
    assert 'enctype="multipart/form-data"' in html and 'name="body_file"' in html


def test_an_untouched_crlf_body_is_sent_byte_for_byte(operator_client, make_queue, error_queue):
    queue = make_queue()
    original = "\nfirst line\r\nsecond\r\n"
    record = fail_message(queue, body=original)
    # What a browser posts: CRLF for every line break (here without the leading newline too).
    response = operator_client.post(f"/failed/{record.pk}/edit/", {"body": "\r\nfirst line\r\nsecond\r\n",
                                                                   "hk": ["Tenant"], "hv": ["acme"]})
    assert response.status_code == 303, response.content[:300]
    assert _copy_of(queue) == original.encode()


def test_an_edited_crlf_body_keeps_crlf_and_an_lf_body_keeps_lf(operator_client, make_queue, error_queue):
    queue = make_queue()
    crlf = fail_message(queue, body="a\r\nb\r\n")
    assert operator_client.post(f"/failed/{crlf.pk}/edit/", {"body": "a\r\nB\r\n"}).status_code == 303
    assert _copy_of(queue) == b"a\r\nB\r\n"
    Transport().purge(queue)
    lf = fail_message(queue, body='{\n  "x": 1\n}')
    assert operator_client.post(f"/failed/{lf.pk}/edit/", {"body": '{\r\n  "x": 2\r\n}'}).status_code == 303
    assert _copy_of(queue) == b'{\n  "x": 2\n}'


def test_a_4_mib_edit_is_accepted_as_a_file_part_and_a_bigger_one_refused_clearly(operator_client, make_queue,
                                                                                error_queue):
    from django.core.files.uploadedfile import SimpleUploadedFile

    queue = make_queue()
    record = fail_message(queue, body="small")
    big = "z" * (4 * MIB - 16)
    response = operator_client.post(f"/failed/{record.pk}/edit/", {
        "body_file": SimpleUploadedFile("body.txt", big.encode(), "text/plain")})
    assert response.status_code == 303, response.content[:300]
    assert _copy_of(queue) == big.encode()
    other = fail_message(queue, body="small")
    response = operator_client.post(f"/failed/{other.pk}/edit/", {
        "body_file": SimpleUploadedFile("body.txt", b"z" * (4 * MIB + 1), "text/plain")})
    assert response.status_code == 413
    assert "SLUICE_MAX_BODY_BYTES allows 4194304" in response.content.decode()


# -- item 12: payload privacy -----------------------------------------------------------------------

SECRET_BODY = '{"order": 7, "card": {"Number": "4111111111111111", "cvc": "123"}, "items": [{"password": "hunter2"}]}'


@pytest.fixture
def masking(settings):
    settings.SLUICE_MASK_HEADERS = ("Authorization",)
    settings.SLUICE_MASK_BODY_FIELDS = ("number", "cvc", "password")


def test_masked_fields_never_show_on_pages_downloads_or_the_api(operator_client, make_queue, error_queue, masking):
    queue = make_queue()
    record = fail_message(queue, body=SECRET_BODY, headers={"Authorization": "Bearer s3cr3t"})
    Transport().send(queue, SECRET_BODY, headers={"Authorization": "Bearer s3cr3t"})
    row_version = Transport().browse(queue, limit=1)[0].row_version
    shown = [
        operator_client.get(f"/failed/{record.pk}/").content,
        operator_client.get(f"/failed/{record.pk}/body").content,
        operator_client.get(f"/failed/{record.pk}/edit/").content,
        operator_client.get(f"/queues/{queue}/messages/{row_version}/").content,
        operator_client.get(f"/queues/{queue}/messages/{row_version}/body").content,
        operator_client.get(f"/api/failed/{record.pk}/").content,
        operator_client.get(f"/api/queues/{queue}/messages/?bodies=1").content,
    ]
    for content in shown:
        text = content.decode()
        assert "4111111111111111" not in text and "hunter2" not in text and "s3cr3t" not in text
        assert "***" in text
    assert '"order": 7' in shown[1].decode()


def test_a_retry_and_an_edit_send_the_unmasked_original(operator_client, make_queue, error_queue, masking):
    queue = make_queue()
    record = fail_message(queue, body=SECRET_BODY, headers={"Authorization": "Bearer s3cr3t"})
    # The edit form as rendered: masked body and header, one field changed by the operator.
    text = operator_client.get(f"/failed/{record.pk}/edit/").context["text"]
    assert "hunter2" not in text
    edited = text.replace('"order": 7', '"order": 8')
    response = operator_client.post(f"/failed/{record.pk}/edit/", {
        "body": edited.replace("\n", "\r\n"), "hk": ["Authorization"], "hv": ["***"]})
    assert response.status_code == 303, response.content[:300]
    (copy,) = Transport().browse(queue)
    import json

    assert json.loads(copy.body) == {**json.loads(SECRET_BODY), "order": 8}
    assert copy.headers["Authorization"] == "Bearer s3cr3t"
    # Untouched: byte for byte.
    Transport().purge(queue)
    other = fail_message(queue, body=SECRET_BODY)
    status, data = api(operator_client, "get", f"/api/failed/{other.pk}/")
    status, _ = api(operator_client, "post", f"/api/failed/{other.pk}/edit-retry/", {"body": data["body"]})
    assert status == 200
    (copy,) = Transport().browse(queue)
    assert copy.body == SECRET_BODY.encode()


def test_an_edit_that_breaks_the_json_of_a_masked_body_is_refused(operator_client, make_queue, error_queue,
                                                                   masking):
    record = fail_message(make_queue(), body=SECRET_BODY)
    response = operator_client.post(f"/failed/{record.pk}/edit/", {"body": "not json"})
    assert response.status_code == 400 and "masked fields" in response.content.decode()


# -- item 3: purge and restore run on the workers, one at a time ------------------------------------

def test_a_purge_is_queued_for_the_workers_once_per_queue(operator_client, queue, clean_broker):
    from dashboard.models import AuditEntry
    from tests.dashboard_api_support import run_queued

    Transport().send_many(queue, [f"m{i}" for i in range(25)])
    assert operator_client.post(f"/queues/{queue}/purge/", {"confirm": queue}).status_code == 303
    assert len(Transport().browse(queue, limit=100)) == 25  # not in the request
    again = operator_client.post(f"/queues/{queue}/purge/", {"confirm": queue})
    assert again.status_code == 409 and b"already under way" in again.content
    op_id = AuditEntry.objects.filter(action="purge_queue", outcome="ok").get().operation_id
    op = run_queued(op_id)
    assert (op.kind, op.status, op.done, op.total) == ("purge", "finished", 25, 25)
    assert Transport().browse(queue) == []
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert f'data-operation="{op_id}" data-status="finished"' in page  # the progress bar
    assert operator_client.post(f"/queues/{queue}/purge/", {"confirm": queue}).status_code == 303


def test_a_group_restore_is_queued_once(operator_client, queue, error_queue, clean_broker):
    from core.models import BulkOperation, FailedMessage

    records = [fail_message(queue, frame="arch") for _ in range(3)]
    FailedMessage.objects.filter(pk__in=[r.pk for r in records]).update(status="archived")
    assert operator_client.post("/failed/restore/", {"group": records[0].group_key}).status_code == 303
    assert set(FailedMessage.objects.values_list("status", flat=True)) == {"archived"}
    again = operator_client.post("/failed/restore/", {"group": records[0].group_key})
    assert again.status_code == 409 and b"already under way" in again.content
    assert BulkOperation.objects.filter(kind="restore").count() == 1


# -- item 2: a statement timeout for every dashboard read -------------------------------------------

@pytest.mark.urls("tests.timeout_urls")
def test_a_read_that_runs_past_the_statement_timeout_is_stopped_with_a_message(operator_client, settings):
    import time

    settings.SLUICE_DASHBOARD_STATEMENT_TIMEOUT = 0.3
    started = time.monotonic()
    response = operator_client.get("/slow/")
    assert time.monotonic() - started < 2.5
    assert response.status_code == 503
    assert "SLUICE_DASHBOARD_STATEMENT_TIMEOUT" in response.content.decode()
    status, data = api(operator_client, "get", "/api/slow/")
    assert status == 503 and "ran longer than 0.3 s" in data["error"]
    # The connection is fine afterwards: the next page renders.
    assert operator_client.get("/audit/").status_code == 200


def test_mssql_bounds_lock_waits_and_resets_them():
    from core.dialects import MSSQLDialect, PostgreSQLDialect

    assert MSSQLDialect().statement_timeout(5) == ("SET LOCK_TIMEOUT 5000", [])
    assert MSSQLDialect().statement_timeout_reset() == ("SET LOCK_TIMEOUT -1", [])
    assert PostgreSQLDialect().statement_timeout(0.25) == (
        "SELECT set_config('statement_timeout', %s, false)", ["250"])


# -- item 2: capped counts, groups cut in SQL, search that does not scan ----------------------------

def test_outbox_page_counts_up_to_a_cap(operator_client, outbox, queue, monkeypatch):
    from core.outbox import OutboxSession
    from dashboard.views import outbox as outbox_view

    for i in range(3):
        with OutboxSession(message_id=f"rec-{i}") as session:
            session.send(queue, {"x": i})
    assert outbox.store.stats().records == 3
    assert outbox.store.stats(cap=2).records == 3  # 2 + 1: "more than 2"
    monkeypatch.setattr(outbox_view, "COUNT_CAP", 2)
    html = operator_client.get("/outbox/").content.decode()
    assert '<div class="value">2+</div>' in html


def test_groups_are_cut_in_sql(queue, error_queue):
    from core import failures

    for frame in ("a", "b", "c"):
        fail_message(queue, frame=frame)
    assert len(failures.groups("exception", limit=2)) == 2
    assert len(failures.groups("exception")) == 3


def test_one_or_two_characters_are_not_searched(operator_client, queue, error_queue):
    fail_message(queue, exception_message="ab")
    html = operator_client.get("/failed/?q=ab").content.decode()
    assert "Type at least 3 characters" in html
    status, data = api(operator_client, "get", "/api/failed/?q=ab")
    assert status == 400 and "at least 3 characters" in data["error"]
    assert operator_client.get("/failed/?q=abc").status_code == 200
    # The spaces around a term do not count, and spaces alone are no search (as on the page).
    status, data = api(operator_client, "get", "/api/failed/?q=%20ab%20")
    assert status == 400 and "at least 3 characters" in data["error"]
    status, data = api(operator_client, "get", "/api/failed/?q=%20%20")
    assert status == 200 and data["count"] == 1


def test_a_search_without_an_index_reads_the_newest_records_only(operator_client, queue, error_queue, monkeypatch):
    from core.dialects import dialect_for
    from dashboard.counting import searching

    records = [fail_message(queue, exception_message="needle here") for _ in range(4)]
    monkeypatch.setattr(searching, "UNINDEXED_SCAN", 2)
    status, data = api(operator_client, "get", "/api/failed/?q=needle")
    indexed = dialect_for(connections[get_settings().DATABASE]).failed_search_expression() is not None
    if indexed:  # PostgreSQL: the trigram index finds them all
        assert data["count"] == 4 and data["search_note"] is None
    else:
        assert data["count"] == 2 and "newest 2 failed messages" in data["search_note"]
        assert {r["id"] for r in data["results"]} == {r.pk for r in records[2:]}
        assert "newest 2 failed messages" in operator_client.get("/failed/?q=needle").content.decode()


def test_a_searchs_count_is_shared_by_its_pages_until_an_action(operator_client, queue, error_queue, clean_broker,
                                                                settings):
    """The next page of a search (or the same search again) does not count again: the count
    is shared like the groups (fresh for SLUICE_DASHBOARD_CACHE_SECONDS); an action on
    failed messages counts afresh."""
    from tests.test_dashboard_api import run_queued

    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 60
    records = [fail_message(queue, exception_message="needle in order") for _ in range(3)]
    search = "/api/failed/?q=needle&status=unresolved&limit=2"
    status, first = api(operator_client, "get", search)
    assert status == 200 and first["count"] == 3 and len(first["results"]) == 2

    def counts(queries) -> list[str]:
        return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "sluice_failed_message" in q["sql"]]

    fail_message(queue, exception_message="needle, later")  # no action: the shared count stands
    with CaptureQueriesContext(connections["default"]) as queries:
        status, second = api(operator_client, "get", f"{search}&cursor={first['next_cursor']}")
    assert status == 200 and second["count"] == 3 and len(second["results"]) == 1
    assert counts(queries) == []  # the first page's count
    status, body = api(operator_client, "post", "/api/failed/archive/", {"ids": [records[0].pk]})
    run_queued(body["operation"])
    status, again = api(operator_client, "get", search)
    assert again["count"] == 3  # counted afresh: 4 failures, one archived


# -- item 2: the snapshot's failed-message counts are read, exact, from the kept counts -------------------

def test_snapshot_reads_exact_failed_counts_kept_by_the_database(operator_client, queue, error_queue, settings):
    from core.models import FailedMessage

    settings.SLUICE_DASHBOARD_EXACT_COUNT_LIMIT = 2  # caps counts of queue rows; failed counts are exact
    for _ in range(5):
        fail_message(queue)
    FailedMessage.objects.filter(pk=FailedMessage.objects.order_by("pk")[0].pk).update(status="archived")
    using = get_settings().DATABASE
    with CaptureQueriesContext(connections[using]) as queries:
        snap = stats.snapshot(max_age=0)
    # One read of the kept counts: the records themselves are neither grouped nor counted.
    assert not [q["sql"] for q in queries if "sluice_failed_message" in q["sql"]]
    assert len([q["sql"] for q in queries if "sluice_failed_queue" in q["sql"]]) == 1
    q = snap.queue(queue)
    assert (snap.failed["unresolved"], snap.failed["archived"], q.errors) == (4, 1, 4)
    assert snap.failed_estimated == snap.failed_capped == [] and not (q.errors_estimated or q.errors_capped)
    html = operator_client.get("/").content.decode()
    assert 'data-total="failed-unresolved">4<' in html
    status, data = api(operator_client, "get", "/api/queues/")
    listed = next(item for item in data["queues"] if item["name"] == queue)
    assert status == 200 and listed["errors"] == 4
    assert (listed["errors_estimated"], listed["errors_capped"]) == (False, False)


# -- item 2: the statement timeout costs no round trip per page ------------------------------------------

def test_the_statement_timeout_is_set_before_a_pages_first_query_and_only_then(operator_client, queue, settings):
    from django.http import HttpResponse
    from django.test import RequestFactory

    from dashboard.timeouts import StatementTimeoutMiddleware

    connection = connections[get_settings().DATABASE]
    if connection.vendor != "postgresql":
        pytest.skip("SQLite bounds reads with a progress handler: there is no session setting to count")
    settings.SLUICE_DASHBOARD_STATEMENT_TIMEOUT = 4
    with CaptureQueriesContext(connection) as page:
        assert operator_client.get("/audit/").status_code == 200
    assert page[0]["sql"] == "SELECT set_config('statement_timeout', '4000', false)"
    assert "RESET statement_timeout" in [q["sql"] for q in page]  # the connection's next user is not bounded
    assert [q["sql"] for q in page].count(page[0]["sql"]) == 1
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"
    # A request that needs no database (a page from the snapshot cache) costs no round trip.
    middleware = StatementTimeoutMiddleware(lambda request: HttpResponse("from the cache"))
    with CaptureQueriesContext(connection) as cached:
        assert middleware(RequestFactory().get("/")).content == b"from the cache"
    assert len(cached) == 0


def test_groups_are_shared_and_refreshed_in_the_background_until_an_action(settings):
    import time

    from tests.conftest import wait_for

    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 0.3
    settings.SLUICE_DASHBOARD_REFRESH_IN_BACKGROUND = True
    computed: list[int] = []

    def groups() -> int:  # what failures.groups would compute, numbered
        computed.append(len(computed) + 1)
        return computed[-1]

    assert stats.shared("test:groups", groups) == 1
    assert stats.shared("test:groups", groups) == 1  # every viewer shares it
    time.sleep(0.4)
    assert stats.shared("test:groups", groups) == 1  # stale: answered at once, a thread computes the next
    wait_for(lambda: stats.shared("test:groups", groups) == 2, timeout=10, what="the background refresh")
    stats.forget_snapshot()  # an action: the next view computes, and shows its effect
    assert stats.shared("test:groups", groups) == 3


def test_the_audit_pages_drop_downs_read_the_newest_entries_only(operator_client, monkeypatch):
    from dashboard.models import AuditEntry
    from dashboard.views import audit

    for name in ("ann", "bob", "cyd"):
        AuditEntry.objects.create(username=name, action=f"act_{name}", outcome="ok")
    monkeypatch.setattr(audit, "CHOICES_SCAN", 2)  # a log kept for years: the newest entries only
    html = operator_client.get("/audit/").content.decode()
    assert "<option >bob</option>" in html and "<option >cyd</option>" in html and "<option >ann<" not in html
    assert "act_cyd" in html and "act_ann</option>" not in html
    chosen = operator_client.get("/audit/?user=ann").content.decode()  # an older name still filters
    assert "<option selected>ann</option>" in chosen
