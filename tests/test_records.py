"""Processing records written by a real pump: every outcome, one INSERT per receive batch,
in the receive's transaction, switchable."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from core.messages import Headers
from core.queues import dialect
from core.models.records import ProcessingRecord
from core.outgoing import valid_correlation_id
from core.records.writer import insert_rows, intent_of, now_us, sent_us, trace_id_of
from tests.conftest import drain, put_raw_row


def records_of(queue: str) -> list[ProcessingRecord]:
    return list(ProcessingRecord.objects.filter(queue=queue).order_by("id"))


def test_every_outcome_is_recorded(transport, make_queue, pump_for, temp_handlers, error_queue):
    queue = make_queue()
    dl_queue = make_queue(dead_letter_on_expiry=True)

    def handle(message, context):
        if message.json()["fail"]:
            raise ValueError("always fails")

    temp_handlers(queue, "Order", handle)
    temp_handlers(dl_queue, "Order", handle)
    before = now_us()
    ok_id = transport.send(queue, {"fail": False}, message_type="Order")
    bad_id = transport.send(queue, {"fail": True}, message_type="Order")
    transport.send(queue, {"fail": False}, message_type="Order", ttl=0)       # expired: dropped
    transport.send(dl_queue, {"fail": False}, message_type="Order", ttl=0)    # expired: dead-lettered
    transport.send(queue, {"fail": False}, message_type="Nobody")             # no handler
    with connection.cursor() as cursor:  # a poison row written by another system
        cursor.execute(dialect().insert_with_expires(queue),
                       ["0b5e3c1e-0000-4000-8000-000000000002", None, None, None, "{not json", b"\x00"])
    drain(pump_for(queue, immediate_retries=2))
    drain(pump_for(dl_queue))
    after = now_us()

    rows = records_of(queue)
    outcomes = sorted(r.outcome for r in rows)
    # the bad one: attempt 1 and 2 retried, attempt 3 failed (to the error queue)
    assert outcomes == sorted(["processed", "retried", "retried", "failed", "expired", "error_queue",
                               "error_queue"])
    bad = [r for r in rows if r.message_id == bad_id]
    assert [(r.outcome, r.attempt) for r in bad] == [("retried", 1), ("retried", 2), ("failed", 3)]
    ok = next(r for r in rows if r.message_id == ok_id)
    assert ok.message_type == "Order" and ok.endpoint == "sluice" and ok.attempt == 1
    assert before <= ok.time_sent_us <= ok.started_us <= ok.ended_us <= after
    poison = next(r for r in rows if r.outcome == "error_queue" and r.message_type is None)
    assert poison.message_id == "0b5e3c1e-0000-4000-8000-000000000002" and poison.time_sent_us is None
    assert [r.outcome for r in records_of(dl_queue)] == ["dead_lettered"]
    assert transport.counts(error_queue).total == 3


def test_one_insert_per_receive_batch_in_the_receive_transaction(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, c: None)
    for i in range(10):
        transport.send(queue, str(i))
    pump = pump_for(queue, concurrency=1, receive_batch_size=10)
    with CaptureQueriesContext(connection) as ctx:
        assert pump.receive_and_process(10) == 10
    inserts = [q["sql"] for q in ctx.captured_queries if "sluice_processing_record" in q["sql"]]
    # One statement: a multi-row VALUES, or on PostgreSQL a COPY from the client.
    assert len(inserts) == 1 and (inserts[0].count("), (") == 9 or inserts[0].startswith("COPY "))
    assert len(records_of(queue)) == 10


def test_header_values_no_text_column_holds_are_recorded_replaced_in_the_same_statement(
        transport, queue, pump_for, temp_handlers):
    """Another system's row whose headers (valid JSON) carry a NUL and a lone surrogate: the
    batch's records are refused before anything reaches the database (on PostgreSQL, before
    the COPY starts), written again with U+FFFD in their place, and the batch commits, its
    other record untouched.  The message keeps its headers as they were."""
    seen = []
    temp_handlers(queue, "Odd\x00Type", lambda m, c: seen.append(m.headers[Headers.ORIGINATING_ENDPOINT]))
    temp_handlers(queue, "Plain", lambda m, c: seen.append("plain"))
    odd = json.dumps({Headers.MESSAGE_ID: "0b5e3c1e-0000-4000-8000-0000000000aa", Headers.ENCLOSED_MESSAGE_TYPES:
                      "Odd\x00Type", Headers.ORIGINATING_ENDPOINT: "far\ud800side"})
    put_raw_row(queue, odd, b"{}")
    plain_id = transport.send(queue, {}, message_type="Plain")
    pump = pump_for(queue, concurrency=1, receive_batch_size=10)
    with CaptureQueriesContext(connection) as ctx:
        assert pump.receive_and_process(10) == 2
    assert seen == ["far\ud800side", "plain"]
    writes = [q["sql"] for q in ctx.captured_queries if "sluice_processing_record" in q["sql"]]
    assert len(writes) == 1  # the refused first try never reached the database
    rows = {r.message_id: r for r in records_of(queue)}
    weird = rows["0b5e3c1e-0000-4000-8000-0000000000aa"]
    assert (weird.message_type, weird.originating_endpoint, weird.outcome) == (
        "Odd\ufffdType", "far\ufffdside", "processed")
    assert rows[plain_id].message_type == "Plain" and rows[plain_id].outcome == "processed"


class WorkerDied(BaseException):
    """Not an Exception: the pump does not treat it as a handler failure."""


def test_records_roll_back_with_the_receive(transport, queue, pump_for, temp_handlers):
    """The process dies in the middle of a batch: the receive rolls back, the messages are
    back in their queue, and no record claims the first one was processed."""
    def handle(message, context):
        if message.text == "dies":
            raise WorkerDied()

    temp_handlers(queue, None, handle)
    for text in ("ok", "dies", "ok"):
        transport.send(queue, text)
    pump = pump_for(queue, concurrency=1, receive_batch_size=3)
    with pytest.raises(WorkerDied):
        pump.receive_and_process(3)
    assert records_of(queue) == []
    assert transport.counts(queue).total == 3


def test_switched_off(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, c: None)
    with override_settings(SLUICE_PROCESSING_RECORDS=False):
        transport.send(queue, "x")
        drain(pump_for(queue))
    assert records_of(queue) == []
    assert transport.counts(queue).total == 0


def test_a_batch_of_records_with_columns_all_missing_and_wide_numbers(transactional_db):
    """The one-statement insert copes with a column that is NULL in every row (a batch of
    poison messages has no types, no time sent) and with microseconds past 2**31."""
    late = 2 ** 53
    insert_rows([("m-1", None, "q-wide", "e", None, 1, late, "error_queue", 1, None),
                 ("m-2", None, "q-wide", "e", None, 2, late + 1, "error_queue", 3, None)], "default")
    insert_rows([("m-3", "Order", "q-wide", "e", 5, 6, 7, "processed", 1, late)], "default")
    rows = ProcessingRecord.objects.filter(queue="q-wide").order_by("message_id")
    assert [(r.message_id, r.message_type, r.time_sent_us, r.ended_us, r.attempt, r.deliver_at_us) for r in rows] == [
        ("m-1", None, None, late, 1, None), ("m-2", None, None, late + 1, 3, None), ("m-3", "Order", 5, 7, 1, late)]


def test_time_sent_header_parsing():
    moment = dt.datetime(2026, 11, 23, 4, 15, 16, 123456, tzinfo=dt.timezone.utc)
    assert sent_us("2026-11-23 04:15:16:123456 Z") == int(moment.timestamp()) * 1_000_000 + 123456
    assert sent_us("2026-11-23 04:15:16:12 Z") == int(moment.timestamp()) * 1_000_000 + 120000
    assert sent_us(None) is None and sent_us("") is None and sent_us("yesterday at noon") is None


@pytest.mark.postgresql
def test_concurrent_pump_threads_record_each_message_once(transport, queue, pump_for, temp_handlers):
    temp_handlers(queue, None, lambda m, c: None)
    ids = {transport.send(queue, str(i)) for i in range(200)}
    drain(pump_for(queue, concurrency=4, receive_batch_size=8))
    rows = records_of(queue)
    assert sorted(r.message_id for r in rows) == sorted(ids)
    assert {r.outcome for r in rows} == {"processed"}


def test_records_keep_where_a_message_belongs_and_who_handled_it(transport, make_queue, pump_for, temp_handlers):
    """A handler's send and reply stay in the sender's conversation; each record says so,
    with the intent, the originating endpoint and host, the worker and the trace id."""
    orders, billing = make_queue(), make_queue()
    temp_handlers(orders, None, lambda m, c: c.send(billing, {"bill": 1}))
    temp_handlers(billing, None, lambda m, c: None)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    first = transport.send(orders, {"order": 1}, correlation_id="order-42",
                           headers={Headers.TRACEPARENT: f"00-{trace}-00f067aa0ba902b7-01"})
    drain(pump_for(orders))
    drain(pump_for(billing))
    placed, = records_of(orders)
    billed, = records_of(billing)
    assert placed.message_id == first and placed.related_to is None and placed.intent == "send"
    assert placed.correlation_id == "order-42" and placed.trace_id == trace
    assert billed.conversation_id == placed.conversation_id and placed.conversation_id
    assert billed.related_to == first and billed.intent == "send"
    assert placed.originating_endpoint and placed.originating_host
    assert placed.worker and ":" in placed.worker


def test_intent_and_trace_id_readings():
    assert intent_of({Headers.RETRY_OF: "7", Headers.DELIVER_AT: "x"}) == "retry"
    assert intent_of({Headers.DELIVER_AT: "2026-11-23 04:15:16:123456 Z"}) == "delayed"
    assert intent_of({Headers.DELAYED_RETRIES: "1", Headers.DELIVER_AT: "x"}) == "retry"
    assert intent_of({Headers.MESSAGE_INTENT: "Reply"}) == "reply"
    assert intent_of({Headers.MESSAGE_INTENT: "Subscribe"}) == "send" and intent_of({}) == "send"
    assert trace_id_of("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_of("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None
    assert trace_id_of("garbage") is None and trace_id_of(None) is None
    assert trace_id_of("00-zzf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") is None


def test_a_handlers_send_keeps_the_correlation_id(transport, make_queue, pump_for, temp_handlers):
    """The incoming correlation id travels on: a search by it finds the whole conversation."""
    first, second = make_queue(), make_queue()
    temp_handlers(first, None, lambda m, c: c.send(second, {"next": 1}))
    temp_handlers(second, None, lambda m, c: None)
    transport.send(first, {"a": 1}, correlation_id="order-42")
    drain(pump_for(first))
    drain(pump_for(second))
    assert [r.correlation_id for r in records_of(second)] == ["order-42"]


def test_a_correlation_id_the_column_refuses_is_not_inherited():
    """A foreign producer's over-long or control-character correlation id would make every
    send of the handler fail at insert time: it does not travel on."""
    assert valid_correlation_id("order-42") and valid_correlation_id("x" * 255)
    assert not valid_correlation_id("x" * 256) and not valid_correlation_id("a\x00b")
