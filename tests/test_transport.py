"""Sending, receiving, peeking, browsing, deleting and purging queue tables."""
from __future__ import annotations

import datetime as dt
import json
import threading

import hypothesis
import pytest
from django.db import connection, transaction
from hypothesis import strategies as st

from core.errors import BodyTooLarge, InvalidHeaders, InvalidMessage, InvalidTTL, UnknownQueue
from core.messages import Headers, Message
from core.queues import dialect
from core.transport import Transport


def db_now() -> dt.datetime:
    """The database's clock (what Expires is computed from)."""
    d = dialect()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        return d.to_datetime(cursor.fetchone()[0])


def test_send_then_receive_round_trip(transport, queue):
    message_id = transport.send(queue, {"hello": "world"}, message_type="Greeting",
                                headers={"Custom": "yes"}, correlation_id="corr-1", reply_to="replies")
    message = transport.receive(queue)
    assert message.headers[Headers.MESSAGE_ID] == message_id
    assert message.message_type == "Greeting"
    assert message.json() == {"hello": "world"}
    assert message.headers["Custom"] == "yes"
    assert message.headers[Headers.CONTENT_TYPE] == "application/json"
    assert message.headers[Headers.CORRELATION_ID] == "corr-1"
    assert message.headers[Headers.REPLY_TO_ADDRESS] == "replies"
    assert message.correlation_id == "corr-1" and message.reply_to == "replies"
    assert message.expires is None and not message.expired
    assert transport.receive(queue) is None


def test_bodies_can_be_bytes_text_or_json(transport, queue):
    transport.send(queue, b"\x00\xff raw")
    transport.send(queue, "tëxt")
    transport.send(queue, [1, 2, 3])
    bodies = [m.body for m in transport.receive_batch(queue, 10)]
    assert bodies == [b"\x00\xff raw", "tëxt".encode(), b"[1,2,3]"]


def parsed(parse):
    try:
        return "ok", parse()
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        return type(exc).__name__


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.one_of(
    st.binary(max_size=12),
    st.tuples(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                       max_size=3), max_leaves=6),
              st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le",
                               "utf-32-be"]), st.booleans())
    .map(lambda v: ((" " if v[2] else "") + json.dumps(v[0], ensure_ascii=False)).encode(v[1], "surrogatepass"))))
def test_message_json_reads_a_body_as_json_loads_reads_its_bytes(body):
    """Message.json() skips json's encoding guess for a body that opens with two ASCII
    bytes; every body (any encoding json reads, any bytes) parses as json.loads(body) does."""
    message = Message("id", {}, body, "q")
    assert parsed(message.json) == parsed(lambda: json.loads(body))


def test_fifo_order_holds(transport, queue):
    sent = [transport.send(queue, {"n": i}) for i in range(50)]
    received = []
    while (m := transport.receive(queue)) is not None:
        received.append(m.headers[Headers.MESSAGE_ID])
    assert received == sent


def test_batch_receive_takes_the_oldest_first(transport, queue):
    for i in range(10):
        transport.send(queue, {"n": i})
    first = transport.receive_batch(queue, 4)
    assert [m.json()["n"] for m in first] == [0, 1, 2, 3]
    assert [m.json()["n"] for m in transport.receive_batch(queue, 100)] == list(range(4, 10))


def test_a_rolled_back_receive_returns_the_message(transport, queue):
    message_id = transport.send(queue, "keep me")
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            assert transport.receive(queue).headers[Headers.MESSAGE_ID] == message_id
            raise RuntimeError("handler crashed")
    again = transport.receive(queue)
    assert again.headers[Headers.MESSAGE_ID] == message_id


def test_a_non_uuid_message_id_is_kept_in_its_header(transport, queue):
    transport.send(queue, "x", message_id="order-42")
    message = transport.receive(queue)
    assert message.headers[Headers.MESSAGE_ID] == "order-42"
    assert len(message.id) == 36  # the Id column holds a uuid derived from it


def test_expires_comes_from_the_database_clock(transport, queue):
    before = db_now()
    transport.send(queue, "x", ttl=60)
    after = db_now()
    message = transport.browse(queue)[0]
    slack = dt.timedelta(milliseconds=50)
    assert before + dt.timedelta(seconds=60) - slack <= message.expires <= after + dt.timedelta(seconds=60) + slack
    assert message.headers[Headers.TIME_TO_BE_RECEIVED] == "00:01:00"


def test_queue_ttl_is_the_default_and_the_ceiling(transport, make_queue):
    name = make_queue(ttl=30)
    transport.send(name, "default")
    transport.send(name, "longer", ttl=3600)
    transport.send(name, "shorter", ttl=5)
    now = db_now()
    lifetimes = [round((m.expires - now).total_seconds()) for m in transport.browse(name)]
    assert lifetimes == [30, 30, 5]


def test_peek_estimate_spans_row_versions_without_counting(transport, queue):
    assert transport.peek_estimate(queue) == 0
    for i in range(5):
        transport.send(queue, str(i))
    assert transport.peek_estimate(queue) == 5
    assert "COUNT" not in dialect().peek_estimate(queue).upper()


def test_browse_pages_in_fifo_order_without_taking(transport, queue):
    for i in range(7):
        transport.send(queue, str(i))
    page1 = transport.browse(queue, limit=3)
    page2 = transport.browse(queue, limit=10, after=page1[-1].row_version)
    assert [m.body for m in page1 + page2] == [str(i).encode() for i in range(7)]
    assert transport.counts(queue).total == 7


def test_delete_by_id(transport, queue):
    keep = transport.send(queue, "keep")
    drop = transport.send(queue, "drop")
    assert transport.delete(queue, drop) is True
    assert transport.delete(queue, drop) is False
    assert [m.headers[Headers.MESSAGE_ID] for m in transport.browse(queue)] == [keep]


def test_purge_in_batches_and_expired_only(transport, queue):
    for i in range(25):
        transport.send(queue, str(i), ttl=0 if i % 5 == 0 else None)
    assert transport.counts(queue).expired == 5
    assert transport.purge(queue, expired_only=True, batch_size=2) == 5
    assert transport.counts(queue).total == 20
    assert transport.purge(queue, batch_size=7) == 20
    assert transport.counts(queue).total == 0


def test_a_purge_batch_never_exceeds_4000_rows(transport, queue):
    """Defect 4: more row locks than that and SQL Server escalates to a table lock; the
    generic purge caps whatever batch size it is given."""
    transport.send_many(queue, [""] * 4005)
    assert transport.purge(queue, batch_size=10_000, max_batches=1) == 4000
    assert transport.counts(queue).total == 5


def test_expired_flag_is_computed_by_the_database(transport, queue):
    transport.send(queue, "dead", ttl=0)
    transport.send(queue, "alive", ttl=3600)
    dead, alive = transport.receive_batch(queue, 2)
    assert dead.expired and not alive.expired


# -- bad input: a clear error, nothing written ---------------------------------------------------

@pytest.mark.parametrize("ttl", [-1, "soon", float("nan"), float("inf"), True, 10 ** 12])
def test_bad_ttl_is_refused(transport, queue, ttl):
    with pytest.raises(InvalidTTL):
        transport.send(queue, "x", ttl=ttl)
    assert transport.counts(queue).total == 0


@pytest.mark.parametrize("headers", [{"n": 1}, {"nested": {"a": "b"}}, {1: "x"}, ["a", "b"], {"x": None}])
def test_headers_must_map_strings_to_strings(transport, queue, headers):
    with pytest.raises(InvalidHeaders):
        transport.send(queue, "x", headers=headers)
    assert transport.counts(queue).total == 0


def test_body_over_the_maximum_is_refused(transport, queue, settings):
    settings.SLUICE_MAX_BODY_BYTES = 1000
    with pytest.raises(BodyTooLarge, match="1001 bytes"):
        transport.send(queue, b"x" * 1001)
    transport.send(queue, b"x" * 1000)
    assert transport.counts(queue).total == 1


@pytest.mark.parametrize("body", [object(), {"when": dt.datetime(2026, 1, 1)}, {1, 2}, {"x": float("nan")},
                                  [float("inf")]])
def test_a_body_that_is_not_json_serialisable_is_refused(transport, queue, body):
    with pytest.raises(InvalidMessage):
        transport.send(queue, body)


@pytest.mark.parametrize("message_id", ["", "  ", "x" * 201, "bad\nid"])
def test_bad_message_ids_are_refused(transport, queue, message_id):
    with pytest.raises(InvalidMessage):
        transport.send(queue, "x", message_id=message_id)


def test_unknown_queue(transport):
    with pytest.raises(UnknownQueue, match="does not exist"):
        transport.send("nosuchqueue", "x")
    with pytest.raises(UnknownQueue):
        transport.receive("nosuchqueue")


def test_a_failed_send_inside_a_transaction_leaves_nothing_half_written(transport, queue):
    from core.demo.models import PingRecord

    with pytest.raises(InvalidHeaders):
        with transaction.atomic():
            PingRecord.objects.create(message_id="business-write")
            transport.send(queue, "ok")
            transport.send(queue, "bad", headers={"n": 1})
    assert transport.counts(queue).total == 0
    assert not PingRecord.objects.filter(message_id="business-write").exists()


def test_concurrent_receivers_in_threads_never_share_a_message(transport, queue):
    for i in range(200):
        transport.send(queue, str(i))
    seen: list[bytes] = []
    lock = threading.Lock()

    def receiver() -> None:
        t = Transport()
        try:
            while True:
                with transaction.atomic():
                    batch = t.receive_batch(queue, 3)
                if not batch:
                    return
                with lock:
                    seen.extend(m.body for m in batch)
        finally:
            connection.close()

    threads = [threading.Thread(target=receiver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen, key=int) == [str(i).encode() for i in range(200)]


def test_headers_are_stored_as_a_flat_json_object(transport, queue):
    transport.send(queue, "x", headers={"A": "1"})
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT {dialect().quote("Headers")} FROM {dialect().table(queue)}', [])
        stored = json.loads(cursor.fetchone()[0])
    assert stored["A"] == "1" and all(isinstance(v, str) for v in stored.values())
