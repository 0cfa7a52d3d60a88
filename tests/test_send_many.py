"""Transport.send_many: one statement per chunk, in order, Expires from the database clock."""
from __future__ import annotations

import datetime as dt
import json
import time
import uuid

import hypothesis
import pytest
from hypothesis import strategies as st
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from core.errors import BodyTooLarge, InvalidMessage
from core.messages import Headers
from core.outgoing import new_ids
from core.queues import dialect
from tests.test_delayed import store  # noqa: F401 — the fixture


#: Any JSON value, with floats that are not JSON (NaN, infinities) and keys json turns to text.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=5) | st.integers() | st.booleans() | st.none(), inner, max_size=4),
    max_leaves=20)


def db_now(d) -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        return d.to_datetime(cursor.fetchone()[0])


def all_messages(transport, queue):
    out, after = [], 0
    while True:
        page = transport.browse(queue, limit=5000, after=after)
        if not page:
            return out
        out += page
        after = page[-1].row_version


def test_send_many_of_20000_keeps_list_order_distinct_ids_and_database_expiry(transport, queue):
    d = dialect("default")
    before = db_now(d)
    with transaction.atomic():
        ids = transport.send_many(queue, [{"i": i} for i in range(20_000)], ttl=600)
    after = db_now(d)
    messages = all_messages(transport, queue)
    assert [str(m.id) for m in messages] == ids  # RowVersion order = list order
    assert len(set(ids)) == 20_000
    assert [int(m.body.decode().split(":")[1].rstrip("}")) for m in messages] == list(range(20_000))
    slack = dt.timedelta(seconds=1)  # SQLite keeps milliseconds
    for m in messages:
        assert before + dt.timedelta(seconds=600) - slack <= m.expires <= after + dt.timedelta(seconds=600) + slack


def test_send_many_is_one_statement_per_chunk(transport, queue):
    d = dialect("default")
    per_row = 5 + len(d.ttl_params(60))
    size = d.insert_rows_per_statement(per_row)
    count = min(size * 2 + 1, 3000)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        transport.send_many(queue, ["x"] * count, ttl=60)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT INTO") and "sluice_queue" not in q["sql"]]
    assert len(inserts) == -(-count // size)
    assert transport.counts(queue).total == count


def test_send_many_without_ttl_and_a_single_message(transport, queue):
    [one] = transport.send_many(queue, ["only"])
    (m,) = transport.browse(queue)
    assert str(m.id) == one and m.expires is None


def test_send_many_with_a_delay_lands_in_the_delayed_store_in_one_statement(transport, queue, store):  # noqa: F811
    with CaptureQueriesContext(connection) as queries:
        ids = transport.send_many(queue, ["a", "b", "c"], delay=3600)
    assert transport.counts(queue).total == 0
    stored, now = store.list(100)
    mine = [m for m in stored if m.destination == queue]
    assert sorted(m.id for m in mine) == sorted(ids)
    assert all(dt.timedelta(seconds=3590) < m.due - now <= dt.timedelta(seconds=3600) for m in mine)
    assert len([q for q in queries.captured_queries if "INSERT INTO" in q["sql"] and store.table in q["sql"]]) == 1
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    later = transport.send_many(queue, ["d", "e"], deliver_at=at)
    stored, _ = store.list(100)
    assert {m.id: m.due for m in stored if m.id in later} == {later[0]: pytest.approx(at, abs=dt.timedelta(
        milliseconds=1)), later[1]: pytest.approx(at, abs=dt.timedelta(milliseconds=1))}
    with pytest.raises(InvalidMessage, match="not both"):
        transport.send_many(queue, ["x"], delay=60, deliver_at=dt.datetime.now(dt.timezone.utc))


def test_each_message_of_a_batch_has_the_headers_a_single_send_gives_it(transport, queue):
    """The batch builder validates the options once and copies the first message's
    headers: every message still gets its own id, correlation id (its own id) and
    conversation; the options' headers are on all of them."""
    options = dict(message_type="orders.Placed", ttl=60, reply_to="replies", headers={"Tenant": "acme \"ü\""})
    ids = transport.send_many(queue, [{"n": i} for i in range(50)], **options)
    single = transport.send(queue, {"n": 50}, **options)
    messages = all_messages(transport, queue)
    assert [m.id for m in messages] == [*ids, single]
    for m in messages:
        assert uuid.UUID(m.id).version == 7 and str(uuid.UUID(m.id)) == m.id
        assert m.headers[Headers.MESSAGE_ID] == m.id == m.headers[Headers.CORRELATION_ID] == m.correlation_id
        assert m.headers["Tenant"] == 'acme "ü"' and m.reply_to == "replies"
        assert m.headers[Headers.ENCLOSED_MESSAGE_TYPES] == "orders.Placed"
        assert m.headers[Headers.CONTENT_TYPE] == "application/json"
        assert m.headers[Headers.TIME_TO_BE_RECEIVED] == "00:01:00"
        assert set(m.headers) == set(messages[-1].headers)  # the same names as a single send's
    assert len({m.headers[Headers.CONVERSATION_ID] for m in messages}) == 51


def test_a_batch_keeps_given_correlation_and_conversation_and_mixed_body_types(transport, queue):
    ids = transport.send_many(queue, [{"a": 1}, "text", b"\x00bytes", {"b": 2}], correlation_id="corr-1",
                              headers={Headers.CONVERSATION_ID: "conv-1"})
    messages = all_messages(transport, queue)
    assert [m.id for m in messages] == ids and len(set(ids)) == 4
    assert {m.correlation_id for m in messages} == {"corr-1"}
    assert {m.headers[Headers.CORRELATION_ID] for m in messages} == {"corr-1"}
    assert {m.headers[Headers.CONVERSATION_ID] for m in messages} == {"conv-1"}
    assert [m.headers[Headers.CONTENT_TYPE] for m in messages] == [
        "application/json", "text/plain", "application/octet-stream", "application/json"]
    assert [m.body for m in messages] == [b'{"a":1}', b"text", b"\x00bytes", b'{"b":2}']


def test_header_values_with_braces_and_format_fields_are_kept_in_every_message(transport, queue):
    """The batch writes each message's headers from a template (core.outgoing.like_first):
    values that look like its fields, or hold its braces, stay as they were given."""
    given = {"A": "{0}", "B": "}{1}{", "C": "{{x}}", "D": '"{"'}
    ids = transport.send_many(queue, [{"n": i} for i in range(3)], headers=given)
    messages = all_messages(transport, queue)
    assert [m.id for m in messages] == ids
    for m in messages:
        assert {name: m.headers[name] for name in given} == given
        assert m.headers[Headers.MESSAGE_ID] == m.id and len({m.headers[Headers.CONVERSATION_ID]}) == 1


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(json_values)
def test_bodies_are_encoded_as_json_dumps_encodes_them(value):
    """The body encoder builds json's C encoder once (core.outgoing._compact_json): the
    text and the errors must be json.dumps's with the same options, for any value."""
    from core.outgoing import json_text

    def outcome(encode):
        try:
            return encode(value)
        except (TypeError, ValueError) as exc:
            return type(exc).__name__, str(exc)

    assert outcome(json_text) == outcome(
        lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False))


def test_bodies_that_are_not_json_are_refused_as_json_dumps_refuses_them():
    from core.outgoing import json_text

    loop: list = []
    loop.append(loop)
    for value in (float("nan"), float("inf"), loop, {(1,): 2}, object(), {"a": {1, 2}}):
        with pytest.raises((TypeError, ValueError)) as ours:
            json_text(value)
        with pytest.raises((TypeError, ValueError)) as theirs:
            json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_a_bad_body_anywhere_in_a_batch_sends_nothing(transport, queue, settings):
    settings.SLUICE_MAX_BODY_BYTES = 100
    with pytest.raises(BodyTooLarge):
        transport.send_many(queue, ["small", "x" * 101])
    with pytest.raises(InvalidMessage):
        transport.send_many(queue, ["small", object()])
    assert transport.counts(queue).total == 0


def test_new_ids_are_version_7_uuids_in_canonical_form_that_sort_by_when_they_were_made():
    """Message and conversation ids are time-ordered, so the B-tree indexes keyed on them
    (processing records, the outbox, task results) grow at their right edge instead of
    touching a random page per row."""
    first = new_ids(1000)
    time.sleep(0.002)
    later = new_ids(1000)
    assert len(set(first + later)) == 2000
    for text in first + later:
        value = uuid.UUID(text)
        assert value.version == 7 and value.variant == uuid.RFC_4122 and str(value) == text
    assert max(first) < min(later)  # as text, as the records' columns compare them
    assert max(map(uuid.UUID, first)) < min(map(uuid.UUID, later))  # as uuids (PostgreSQL's uuid type)
    made_ms = int(first[0].replace("-", "")[:12], 16)
    assert abs(made_ms - time.time() * 1000) < 60_000


def test_a_single_send_makes_time_ordered_message_and_conversation_ids(transport, queue):
    ids = [transport.send(queue, {"n": n}) for n in range(3)]
    messages = all_messages(transport, queue)
    assert ids == sorted(ids) == [m.id for m in messages]
    conversations = [m.headers[Headers.CONVERSATION_ID] for m in messages]
    assert all(uuid.UUID(c).version == 7 for c in conversations) and len(set(conversations)) == 3


def queue_statements(queries, d, queue) -> list[str]:
    """The captured statements that wrote into ``queue``'s table, by their first word."""
    return [q["sql"].split()[0] for q in queries.captured_queries
            if q["sql"].split()[0] in ("INSERT", "COPY") and d.table(queue) in q["sql"]]


def test_a_large_batch_without_ttl_goes_in_as_one_copy_where_the_database_has_copy(transport, queue):
    """On PostgreSQL a batch of many messages without a TTL is one ``COPY … FROM STDIN``
    (the database parses its rows with less work than it unnests arrays); a small batch,
    and every batch elsewhere, is an INSERT.  Either way: list order, ids, bodies, no
    expiry."""
    d = dialect("default")
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        ids = transport.send_many(queue, [{"i": i} for i in range(300)])
    expected = ["COPY"] if d.copy_rows(queue, 300, False) else ["INSERT"] * -(-300 // d.insert_rows_per_statement(6))
    assert queue_statements(queries, d, queue) == expected
    assert (expected == ["COPY"]) == d.supports_copy_in
    messages = all_messages(transport, queue)
    assert [str(m.id) for m in messages] == ids
    assert [m.body for m in messages] == [f'{{"i":{i}}}'.encode() for i in range(300)]
    assert all(m.expires is None for m in messages)
    assert [m.headers[Headers.MESSAGE_ID] for m in messages] == ids
    with CaptureQueriesContext(connection) as queries:
        transport.send_many(queue, ["a", "b", "c"])
    assert queue_statements(queries, d, queue) == ["INSERT"]


def test_a_copied_batch_keeps_the_expiry_each_row_was_given(transport, queue):
    """Rows that keep an absolute Expires (an immediate retry keeps its expiry; the
    delayed mover's rows) keep it whichever statement inserts them (SQLite keeps milliseconds)."""
    import dataclasses

    base = dt.datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=dt.timezone.utc)
    rows = [dataclasses.replace(transport.build(queue, {"i": i}), ttl_seconds=None,
                                expires=base + dt.timedelta(milliseconds=i)) for i in range(200)]
    with transaction.atomic():
        transport.enqueue(rows)
    messages = all_messages(transport, queue)
    assert [m.expires for m in messages] == [base + dt.timedelta(milliseconds=i) for i in range(200)]


def test_a_copied_batch_rolls_back_with_its_savepoint(transport, queue):
    with transaction.atomic():
        transport.send_many(queue, ["kept"] * 150)
        try:
            with transaction.atomic():
                transport.send_many(queue, ["undone"] * 150)
                raise RuntimeError("the caller's block fails")
        except RuntimeError:
            pass
    assert [m.body for m in all_messages(transport, queue)] == [b"kept"] * 150

