"""Failed messages: ingestion from the error queue, groups, retry (one / list / group / all),
resolution through the pump, archive / restore / delete, edit-and-retry, retention, poison rows,
and no loss when ingestion crashes."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.utils import timezone

from core import failures
from core.errors import InvalidHeaders
from core.failures import (ErrorIngestor, RetryRefused, archive, delete, edit_and_retry, first_frame, groups,
                           ingest_errors, purge_archived, restore, retry, run_archive, run_retry, search,
                           start_archive)
from core.messages import Headers, parse_wire_time
from core.models import BulkOperation, FailedMessage, FailureStatus
from core.queues import delete_queue, dialect
from tests.conftest import drain, put_row
from tests.failed_counts_support import assert_failed_counts_kept


@pytest.fixture(autouse=True)
def _failed_counts_kept(request):
    """After every test that wrote failed messages, through whichever path (ingestion, retry,
    archive, restore, delete, purge, edit-and-retry), the kept group and queue counts are right."""
    uses_db = "transactional_db" in request.fixturenames
    if uses_db:
        request.getfixturevalue("transactional_db")  # torn down after this check
    yield
    if uses_db:
        assert_failed_counts_kept()


@pytest.fixture
def pump_for(pump_for):
    """Pumps that fail fast: no retries, one thread."""
    return lambda queue, **options: pump_for(queue, **{"immediate_retries": 0, "concurrency": 1, **options})


def raise_in_a(text):
    raise ValueError(text)


def raise_in_b(text):
    raise ValueError(text)


def failing(message, context):
    """Fails at one of two sites, chosen by the body: {"site": "a"|"b", "text": ...}."""
    data = message.json()
    (raise_in_a if data.get("site", "a") == "a" else raise_in_b)(data.get("text", "boom"))


@pytest.fixture
def failing_queue(make_queue, temp_handlers, error_queue, pump_for, transport):
    """A queue whose handler always fails; ``fail(*bodies)`` sends them, pumps them into the
    error queue and returns their ids."""
    name = make_queue("orders")
    temp_handlers(name, None, failing)

    def fail(*bodies, message_type="PlaceOrder", queue=name):
        ids = [transport.send(queue, body, message_type=message_type) for body in bodies]
        drain(pump_for(queue))
        return ids

    fail.queue = name
    return fail


def record(message_id) -> FailedMessage:
    return FailedMessage.objects.get(message_id=message_id)


def events(message_id) -> list[str]:
    return [e["event"] for e in record(message_id).history]


# -- ingestion ---------------------------------------------------------------------------------

def test_ingestion_creates_one_record_per_message_with_all_fields(failing_queue, transport, error_queue):
    before = timezone.now()
    ids = failing_queue({"text": "bad order 1"}, {"text": "bad order 2"}, {"text": "bad order 3"})
    headers = {m.headers[Headers.MESSAGE_ID]: m.headers for m in transport.browse(error_queue)}
    assert len(headers) == 3

    assert ingest_errors() == 3
    assert transport.counts(error_queue).total == 0
    assert FailedMessage.objects.count() == 3
    r = record(ids[0])
    assert r.original_queue == failing_queue.queue
    assert r.message_type == "PlaceOrder"
    assert r.exception_type == "ValueError"
    assert r.exception_message == "bad order 1"
    assert "raise_in_a" in r.stack_trace and "Traceback" in r.stack_trace
    assert r.group_title == "ValueError @ tests/test_failures.py:raise_in_a"
    assert len(r.group_key) == 16
    assert r.time_of_failure == parse_wire_time(headers[ids[0]][Headers.TIME_OF_FAILURE])
    assert before - dt.timedelta(seconds=1) <= r.time_of_failure <= timezone.now()
    assert r.first_failed_at == r.time_of_failure and r.last_failed_at >= r.time_of_failure
    assert r.attempts == 1 and r.failure_count == 1
    assert r.status == FailureStatus.UNRESOLVED
    stored = json.loads(r.headers)
    assert stored[Headers.FAILED_Q] == failing_queue.queue and stored[Headers.MESSAGE_ID] == ids[0]
    assert json.loads(bytes(r.body)) == {"text": "bad order 1"}
    assert r.retried_at is None and r.resolved_at is None and r.archived_at is None
    assert r.history[0]["event"] == "failed"
    assert r.history[0]["exception_type"] == "ValueError" and r.history[0]["message"] == "bad order 1"
    assert {record(i).exception_message for i in ids} == {"bad order 1", "bad order 2", "bad order 3"}


def test_ingestion_writes_a_batch_in_a_constant_number_of_statements(error_queue, transport):
    """Issue 11, defect 9: one INSERT for the new records and one UPDATE for the known ones
    per batch, not one statement per message."""
    from django.test.utils import CaptureQueriesContext

    def to_error_queue(*ids):
        for message_id in ids:
            put_row(error_queue, {"id": message_id}, message_id=message_id, message_type="PlaceOrder",
                    headers={Headers.FAILED_Q: "orders", Headers.EXCEPTION_TYPE: "ValueError",
                             Headers.EXCEPTION_MESSAGE: f"bad {message_id}"})

    to_error_queue(*[f"e-{i}" for i in range(5)])
    assert ingest_errors() == 5
    to_error_queue(*[f"e-{i}" for i in range(10)])  # five fail again, five are new
    table = FailedMessage._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        assert ingest_errors(batch_size=10, max_batches=1) == 10
    writes = [q["sql"] for q in queries.captured_queries
              if table in q["sql"] and q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE"))]
    assert len(writes) == 2, writes
    assert FailedMessage.objects.count() == 10
    assert sorted(FailedMessage.objects.values_list("failure_count", flat=True)) == [1] * 5 + [2] * 5
    assert record("e-3").history[-1]["message"] == "bad e-3" and len(record("e-3").history) == 2
    assert record("e-7").status == FailureStatus.UNRESOLVED and record("e-7").exception_type == "ValueError"


def test_ingestor_loop_steps_again_at_once_while_batches_are_full(failing_queue, error_queue, transport):
    failing_queue({}, {}, {})
    ingestor = ErrorIngestor(batch_size=2, interval=1.0)
    assert ingestor.step() == 0.0
    assert ingestor.step() == 1.0
    assert ingestor.step() == 1.0  # empty
    assert ingestor.ingested == 3 and FailedMessage.objects.count() == 3
    ingestor.close()


def test_ingestor_waits_when_the_error_queue_does_not_exist(transactional_db):
    ingestor = ErrorIngestor(queue="no_such_error_queue", interval=1.0)
    assert ingestor.step() >= 1.0


def test_a_re_failure_after_retry_updates_the_same_record(failing_queue, transport, error_queue, pump_for):
    (mid,) = failing_queue({"text": "first"})
    ingest_errors()
    op = run_retry(retry([mid], requested_by="alice").pk)
    assert (op.total, op.done, op.failed, op.status) == (1, 1, 0, "finished")
    back = transport.browse(failing_queue.queue)
    assert len(back) == 1
    h = back[0].headers
    assert h[Headers.MESSAGE_ID] == mid and h[failures.RETRY_OF] == mid and failures.RETRIED_AT in h
    for gone in (Headers.EXCEPTION_TYPE, Headers.EXCEPTION_STACK_TRACE, Headers.FAILED_Q, Headers.TIME_OF_FAILURE,
                 Headers.FAILED_ATTEMPTS, Headers.TOTAL_FAILED_ATTEMPTS, Headers.DELAYED_RETRIES):
        assert gone not in h
    assert record(mid).status == FailureStatus.RETRY_PENDING

    drain(pump_for(failing_queue.queue))  # fails again: back to the error queue
    assert ingest_errors() == 1
    assert FailedMessage.objects.count() == 1
    r = record(mid)
    assert r.failure_count == 2
    assert r.status == FailureStatus.UNRESOLVED
    assert events(mid) == ["failed", "retry", "failed"]
    assert r.history[1]["by"] == "alice" and r.history[1]["operation"] == op.pk
    assert r.attempts == 1  # a fresh set of retries: counted from zero again
    assert r.retried_at is not None


# -- grouping ---------------------------------------------------------------------------------------

def test_groups_by_exception_type_and_first_frame(failing_queue):
    a = failing_queue({"site": "a", "text": "x1"}, {"site": "a", "text": "x2"}, {"site": "a", "text": "x3"})
    b = failing_queue({"site": "b", "text": "y"})
    ingest_errors()
    found = groups()
    assert [(g.title, g.count) for g in found] == [
        ("ValueError @ tests/test_failures.py:raise_in_a", 3),
        ("ValueError @ tests/test_failures.py:raise_in_b", 1)]
    assert found[0].exception_type == "ValueError"
    assert found[0].last_failed == max(record(i).time_of_failure for i in a)
    assert record(a[0]).group_key == record(a[2]).group_key != record(b[0]).group_key
    assert [(g.group_key, g.count) for g in groups(by="queue")] == [(failing_queue.queue, 4)]
    assert [(g.group_key, g.count) for g in groups(by="message_type")] == [("PlaceOrder", 4)]


def test_first_frame_of_python_and_dotnet_stack_traces():
    python = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/.venv/lib/python3.11/site-packages/lib/x.py", line 3, in outer\n'
        "    inner()\n"
        "KeyError: 'k'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/app/orders/handlers.py", line 12, in place_order\n'
        "    save()\n"
        '  File "/srv/app/orders/models.py", line 40, in save\n'
        "    raise ValueError('x')\n"
        "ValueError: x\n")
    assert first_frame(python) == "orders/models.py:save"
    # Line numbers are not part of a group: an edit elsewhere in the file keeps it.
    assert first_frame(python.replace("line 40", "line 41")) == first_frame(python)
    dotnet = ("System.InvalidOperationException: nope\n"
              "   at Shop.Orders.PlaceOrderHandler.Handle(PlaceOrder message, IMessageHandlerContext context) "
              "in C:\\src\\Shop\\PlaceOrderHandler.cs:line 27\n"
              "   at NServiceBus.InvokeHandlerTerminator.Terminate(IInvokeHandlerContext context)\n")
    assert first_frame(dotnet) == ("Shop.Orders.PlaceOrderHandler.Handle(PlaceOrder message, "
                                   "IMessageHandlerContext context)")
    assert first_frame("") == "" and first_frame("just text") == ""
    assert failures.group_of("X", "")[1] == "X"


# -- retry ---------------------------------------------------------------------------------------

def test_retry_one_list_group_and_all(failing_queue, make_queue, temp_handlers, transport, pump_for):
    q1 = failing_queue.queue
    a = failing_queue(*({"site": "a", "text": f"a{i}"} for i in range(5)))
    b = failing_queue({"site": "b"}, {"site": "b"})
    q2 = make_queue("billing")
    temp_handlers(q2, None, failing)
    c = failing_queue({"site": "b"}, {"site": "a"}, message_type="Bill", queue=q2)
    assert ingest_errors() == 9

    # One.
    op = run_retry(retry([a[0]]).pk)
    assert (op.kind, op.total, op.done, op.failed, op.status) == ("retry", 1, 1, 0, "finished")
    assert op.finished_at is not None and op.progress == 1.0
    assert [m.id for m in transport.browse(q1)] == [a[0]]

    # A list, in batches of one; a record already retry-pending is not sent twice.
    op = retry([a[1], b[0], a[0]], requested_by="bob")
    assert op.total == 2 and op.status == "pending" and op.description == "3 selected messages"
    op = run_retry(op.pk, batch_size=1)
    assert (op.total, op.done, op.failed) == (2, 2, 0) and op.requested_by == "bob"

    # A group: the unresolved rest of site a (on both queues).
    group = record(a[2]).group_key
    op = retry({"group": group})
    assert op.total == 4 and op.description.startswith("group ValueError @ tests/test_failures.py:raise_in_a")
    op = run_retry(op.pk, batch_size=3)
    assert (op.total, op.done, op.failed) == (4, 4, 0)
    assert {m.id for m in transport.browse(q2)} == {c[1]}

    # All unresolved of one queue, then all.
    op = run_retry(retry(failures.all_unresolved(queue=q2)).pk)
    assert (op.total, op.done) == (1, 1)
    assert {m.id for m in transport.browse(q2)} == set(c)
    op = run_retry(retry("all").pk)
    assert (op.total, op.done) == (1, 1)  # b[1]: everything else is already pending
    assert {m.id for m in transport.browse(q1)} == set(a) | set(b)
    assert set(FailedMessage.objects.values_list("status", flat=True)) == {FailureStatus.RETRY_PENDING}
    assert BulkOperation.objects.filter(status="finished").count() == 5
    # Running a finished operation again does nothing.
    assert run_retry(op.pk).done == 1
    assert transport.counts(q1).total == 7


def test_progress_is_visible_per_batch(failing_queue, monkeypatch):
    ids = failing_queue(*({"text": str(i)} for i in range(5)))
    ingest_errors()
    op = retry(ids)
    seen = []
    real = failures.bulk.send_back

    def spy(record, *args):
        seen.append(BulkOperation.objects.values_list("status", "done").get(pk=op.pk))
        return real(record, *args)

    monkeypatch.setattr(failures.bulk, "send_back", spy)
    run_retry(op.pk, batch_size=2)
    assert seen == [("running", 0), ("running", 0), ("running", 2), ("running", 2), ("running", 4)]


def test_a_retried_message_that_succeeds_resolves_its_record(make_queue, temp_handlers, error_queue, transport,
                                                            pump_for):
    name = make_queue("flaky")
    fixed = []

    def handler(message, context):
        if not fixed:
            raise RuntimeError("database was down")

    temp_handlers(name, None, handler)
    mid = transport.send(name, {"n": 1})
    drain(pump_for(name))
    ingest_errors()
    run_retry(retry([mid]).pk)
    fixed.append(True)
    pump = pump_for(name)
    drain(pump)
    assert pump.stats.succeeded == 1
    r = record(mid)
    assert r.status == FailureStatus.RESOLVED and r.resolved_at is not None
    assert events(mid) == ["failed", "retry", "resolved"]
    # Resolution is idempotent and ignores unknown ids.
    assert failures.mark_resolved(mid) is False
    assert failures.mark_resolved("no-such-id") is False


def test_a_retry_whose_queue_is_gone_counts_as_failed_with_a_reason(failing_queue, make_queue, temp_handlers):
    gone = make_queue("gone")
    temp_handlers(gone, None, failing)
    lost = failing_queue({}, queue=gone)
    kept = failing_queue({})
    ingest_errors()
    delete_queue(gone)
    op = run_retry(retry("all").pk)
    assert (op.total, op.done, op.failed, op.status) == (2, 1, 1, "finished")
    assert lost[0] in op.error and "no longer exists" in op.error and gone in op.error
    assert record(lost[0]).status == FailureStatus.UNRESOLVED
    assert record(kept[0]).status == FailureStatus.RETRY_PENDING
    assert events(lost[0]) == ["failed"]


# -- archive, restore, delete, purge ------------------------------------------------------------------

def test_archive_restore_and_delete(failing_queue):
    a = failing_queue({"site": "a"}, {"site": "a"})
    b = failing_queue({"site": "b"}, {"site": "b"}, {"site": "b"})
    ingest_errors()
    assert archive([a[0]], requested_by="carol") == 1
    r = record(a[0])
    assert r.status == FailureStatus.ARCHIVED and r.archived_at is not None
    assert r.history[-1]["event"] == "archived" and r.history[-1]["by"] == "carol"
    assert archive({"group": record(b[0]).group_key}) == 3
    assert [g.count for g in groups()] == [1]
    assert search(status="archived").count() == 4
    assert archive([a[0]]) == 0  # already archived

    assert restore([a[0], b[0], a[1]]) == 2  # a[1] was never archived
    assert record(a[0]).status == FailureStatus.UNRESOLVED and record(a[0]).archived_at is None
    assert events(a[0]) == ["failed", "archived", "restored"]

    # A big selection as an operation with progress.
    op = run_archive(start_archive("all", requested_by="carol").pk, batch_size=1)
    assert (op.kind, op.total, op.done, op.status) == ("archive", 3, 3, "finished")
    assert not search(status="unresolved").exists()

    # An archived message can still be retried by id.
    assert run_retry(retry([b[1]]).pk).done == 1

    assert delete([a[0], b[2], "missing"]) == 2
    assert FailedMessage.objects.count() == 3


def test_purge_archived_respects_retention(failing_queue):
    ids = failing_queue({}, {}, {}, {})
    ingest_errors()
    archive(ids[:3])
    FailedMessage.objects.filter(message_id__in=ids[:2]).update(
        archived_at=timezone.now() - dt.timedelta(days=20))
    assert purge_archived(older_than_seconds=14 * 86400, batch=1) == 2
    assert sorted(FailedMessage.objects.values_list("message_id", flat=True)) == sorted(ids[2:])
    assert purge_archived(older_than_seconds=14 * 86400) == 0
    assert purge_archived(older_than_seconds=0) == 1  # ids[2]; ids[3] is unresolved and stays
    assert list(FailedMessage.objects.values_list("message_id", flat=True)) == [ids[3]]


# -- edit and retry -------------------------------------------------------------------------------------

def test_edit_and_retry_with_a_new_body(make_queue, temp_handlers, error_queue, transport, pump_for):
    name = make_queue("edits")
    seen = []

    def handler(message, context):
        data = message.json()
        if not data.get("fixed"):
            raise KeyError("fixed")
        seen.append((data, message.headers.get("Tenant")))

    temp_handlers(name, None, handler)
    mid = transport.send(name, {"fixed": False}, message_type="Edit", headers={"Tenant": "acme"})
    drain(pump_for(name))
    ingest_errors()

    with pytest.raises(InvalidHeaders):
        edit_and_retry(mid, b"{}", {"Tenant": 7})
    assert record(mid).status == FailureStatus.UNRESOLVED

    copy = edit_and_retry(mid, b'{"fixed": true}', requested_by="dave")
    # The original is resolved and keeps what failed; the copy has an id of its own, linked back.
    assert copy.message_id != mid and copy.record.status == FailureStatus.RESOLVED
    assert json.loads(bytes(record(mid).body)) == {"fixed": False}
    last = record(mid).history[-1]
    assert last["event"] == "resolved" and last["edited"] is True and last["by"] == "dave"
    assert last["new_message_id"] == copy.message_id and "body" in last["message"]
    (queued,) = transport.browse(name)
    assert queued.body == b'{"fixed": true}' and queued.headers["Tenant"] == "acme"
    assert queued.headers[Headers.MESSAGE_ID] == copy.message_id
    assert queued.headers[Headers.CORRELATION_ID] == mid and queued.headers[failures.EDIT_OF] == mid
    assert queued.headers[failures.RETRY_OF] == mid and Headers.EXCEPTION_TYPE not in queued.headers
    with pytest.raises(RetryRefused, match="resolved"):
        edit_and_retry(mid, b"{}")
    with pytest.raises(RetryRefused, match="no failed message"):
        edit_and_retry("no-such-id", b"{}")

    drain(pump_for(name))
    assert seen == [({"fixed": True}, "acme")]
    assert record(mid).status == FailureStatus.RESOLVED


def test_edit_and_retry_with_new_headers(failing_queue, transport):
    (mid,) = failing_queue({})
    ingest_errors()
    stored = failures.headers_of(record(mid))
    new = {k: v for k, v in stored.items() if not k.startswith("NServiceBus.ExceptionInfo")}
    new["Tenant"] = "globex"
    copy = edit_and_retry(mid, b'{"site": "a"}', new)
    (queued,) = transport.browse(failing_queue.queue)
    assert queued.headers["Tenant"] == "globex" and queued.headers[Headers.MESSAGE_ID] == copy.message_id
    assert Headers.FAILED_Q not in queued.headers
    assert "headers added: Tenant" in record(mid).history[-1]["message"]
    kept = failures.headers_of(record(mid))  # the record keeps the original as it failed
    assert "Tenant" not in kept and kept[Headers.EXCEPTION_TYPE] == "ValueError"


# -- poison rows and crashes --------------------------------------------------------------------------

def test_poison_rows_become_records(make_queue, temp_handlers, error_queue, transport, pump_for):
    name = make_queue("poison")
    temp_handlers(name, None, lambda m, c: None)
    d = dialect()
    with connection.cursor() as cursor:
        # Another system wrote a row with broken header JSON …
        cursor.execute(d.insert_with_expires(name),
                       ["0b5e3c1e-0000-4000-8000-000000000001", None, None, None, "{not json", b"\x00raw"])
        # … and one straight into the error queue.
        cursor.execute(d.insert_with_expires(error_queue),
                       ["0b5e3c1e-0000-4000-8000-000000000002", None, None, None, "[1, 2]", b"\x01raw"])
    drain(pump_for(name))
    assert ingest_errors() == 2
    moved = record("0b5e3c1e-0000-4000-8000-000000000001")
    assert moved.exception_type == "core.errors.PoisonMessage"
    assert moved.original_queue == name and bytes(moved.body) == b"\x00raw"
    assert failures.headers_of(moved)[Headers.RAW_HEADERS] == "{not json"
    direct = record("0b5e3c1e-0000-4000-8000-000000000002")
    assert direct.exception_type == "core.errors.PoisonMessage" and "not an object" in direct.exception_message
    assert failures.headers_of(direct)[Headers.RAW_HEADERS] == "[1, 2]" and bytes(direct.body) == b"\x01raw"

    # Its headers cannot be sent again as they were: retry refuses, edit-and-retry works.
    op = run_retry(retry([moved.message_id]).pk)
    assert op.failed == 1 and "poison" in op.error
    with pytest.raises(RetryRefused, match="poison"):
        edit_and_retry(moved.message_id, b"fixed")
    copy = edit_and_retry(moved.message_id, b"fixed", {"NServiceBus.EnclosedMessageTypes": "Fixed"})
    (queued,) = transport.browse(name)
    assert queued.body == b"fixed" and queued.headers[Headers.MESSAGE_ID] == copy.message_id
    assert Headers.RAW_HEADERS not in queued.headers


def test_a_crash_during_ingestion_loses_nothing(failing_queue, error_queue, transport, monkeypatch):
    failing_queue({}, {}, {})
    real = failures.ingestion.apply_failure
    calls = []

    def crash_after_first(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("worker killed mid-batch")
        return real(*args)

    monkeypatch.setattr(failures.ingestion, "apply_failure", crash_after_first)
    with pytest.raises(RuntimeError):
        ingest_errors()
    assert transport.counts(error_queue).total == 3  # the receive rolled back with the records
    assert FailedMessage.objects.count() == 0
    monkeypatch.setattr(failures.ingestion, "apply_failure", real)
    assert ingest_errors() == 3
    assert FailedMessage.objects.count() == 3 and transport.counts(error_queue).total == 0


# -- search ------------------------------------------------------------------------------------------------

def test_search_filters(failing_queue, make_queue, temp_handlers):
    a = failing_queue({"site": "a", "text": "card declined"}, {"site": "a", "text": "address missing"})
    q2 = make_queue("billing")
    temp_handlers(q2, None, failing)
    b = failing_queue({"site": "b", "text": "card expired"}, message_type="Bill", queue=q2)
    ingest_errors()
    ids = lambda qs: sorted(qs.values_list("message_id", flat=True))  # noqa: E731
    assert ids(search(text="CARD")) == sorted([a[0], b[0]])
    # part of an id: its random end (the start of a time-ordered id is the time it was made)
    assert ids(search(text=a[1][-12:])) == [a[1]]
    assert ids(search(exception="valueerror")) == sorted(a + b)
    assert ids(search(message_id=b[0])) == [b[0]]
    assert ids(search(queue=q2)) == [b[0]]
    assert ids(search(message_type="PlaceOrder")) == sorted(a)
    assert ids(search(group=record(b[0]).group_key)) == [b[0]]
    assert ids(search(status="resolved")) == []
    later = timezone.now() + dt.timedelta(minutes=1)
    assert ids(search(since=later)) == [] and ids(search(until=later)) == sorted(a + b)
    first = record(a[0]).time_of_failure
    assert a[0] not in ids(search(since=first + dt.timedelta(microseconds=1)))
    assert list(search()) == sorted(search(), key=lambda r: r.time_of_failure, reverse=True)
