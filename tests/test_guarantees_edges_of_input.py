"""What a producer, a handler or another endpoint can put into a message cannot stall a
queue or steer what operators do:

- a send the database would refuse is refused at ``send()`` with a clear error;
- a missing error or dead-letter queue is recreated (loudly), never a poison batch;
- failed-message records are keyed by message id AND queue: two queues' messages with
  one id stay two records, and a retry sends both;
- control headers (``Sluice.*`` counters, ``Sluice.DelayedDestination``, failure headers)
  are Sluice's: a producer cannot set them, and ingestion trusts the delayed destination
  only when the failure happened in the delayed store;
- a row whose headers nest deeper than JSON parsers go is a poison message, not a
  receive that rolls back forever.
"""
from __future__ import annotations

import json
import time

import hypothesis
import pytest
from hypothesis import strategies as st

from core.errors import InvalidMessage, PoisonMessage
from core.expiry import purge_expired_messages
from core.failures import ingest_errors, retry, run_retry
from core.messages import Headers, decode_headers
from core.models import FailedMessage
from core.outbox.operations import UnreadableOperations, decode_operations
from core.queues import DEAD_LETTER_SUFFIX, delete_queue, queue_model
from tests.conftest import drain


def always_fails(message, context):
    raise ValueError("nope")


@pytest.fixture
def pump_for(pump_for):
    return lambda queue, **options: pump_for(queue, **{"immediate_retries": 0, "delayed_retries": 0,
                                                       "concurrency": 1, **options})


# -- sends the database would refuse are refused at send() ---------------------------------------

@pytest.mark.parametrize("field", ["correlation_id", "reply_to"])
def test_an_over_long_correlation_id_or_reply_to_is_refused_at_send(queue, transport, field):
    with pytest.raises(InvalidMessage, match="255"):
        transport.send(queue, {"n": 1}, **{field: "x" * 300})
    assert transport.counts(queue).total == 0


@pytest.mark.parametrize("field", ["correlation_id", "reply_to"])
def test_a_nul_in_correlation_id_or_reply_to_is_refused_at_send(queue, transport, field):
    with pytest.raises(InvalidMessage, match="control"):
        transport.send(queue, {"n": 1}, **{field: "a\x00b"})


def test_header_values_are_checked_like_the_columns_they_fill(queue, transport):
    # CorrelationId given as a header fills the CorrelationId column: same limits.
    with pytest.raises(InvalidMessage, match="255"):
        transport.send(queue, {"n": 1}, headers={Headers.CORRELATION_ID: "y" * 256})
    # Other headers travel JSON-encoded (control characters escaped): any string is safe.
    transport.send(queue, {"n": 1}, headers={"Custom": "a\x00b"})
    assert [m.headers["Custom"] for m in transport.browse(queue)] == ["a\x00b"]


def test_send_many_validates_its_shared_options_too(queue, transport):
    with pytest.raises(InvalidMessage):
        transport.send_many(queue, [{"n": 1}, {"n": 2}], correlation_id="z" * 300)
    assert transport.counts(queue).total == 0


# -- a missing error or dead-letter queue -------------------------------------------------------

def test_a_failing_message_recreates_a_missing_error_queue(make_queue, temp_handlers, error_queue, pump_for,
                                                           transport, caplog):
    name = make_queue("orders")
    temp_handlers(name, None, always_fails)
    ok = make_queue("fine")
    ids = [transport.send(name, {"n": i}) for i in range(3)]
    delete_queue(error_queue)

    with caplog.at_level("ERROR", logger="sluice"):
        drain(pump_for(name))

    assert transport.counts(name).total == 0, "the batch was not stuck"
    assert sorted(m.headers[Headers.MESSAGE_ID] for m in transport.browse(error_queue)) == sorted(ids)
    assert any("recreat" in r.getMessage() for r in caplog.records)
    assert transport.counts(ok).total == 0


def test_an_expired_message_recreates_a_missing_dead_letter_queue(make_queue, pump_for, transport, temp_handlers):
    name = make_queue("short", dead_letter_on_expiry=True)
    temp_handlers(name, None, lambda m, c: None)
    transport.send(name, {"n": 1}, ttl=0.01)
    time.sleep(0.05)
    dlq = name + DEAD_LETTER_SUFFIX
    delete_queue(dlq)

    drain(pump_for(name))

    assert transport.counts(name).total == 0
    assert transport.counts(dlq).total == 1


# -- failure records are keyed by message id and queue ------------------------------------------

def test_two_queues_messages_with_one_id_stay_two_records_and_both_retry(make_queue, temp_handlers, error_queue,
                                                                         pump_for, transport):
    a, b = make_queue("alpha"), make_queue("beta")
    for q in (a, b):
        temp_handlers(q, None, always_fails)
        transport.send(q, {"q": q}, message_id="order/42")
        drain(pump_for(q))
    assert ingest_errors() == 2

    records = FailedMessage.objects.filter(message_id="order/42")
    assert sorted(r.original_queue for r in records) == sorted([a, b])

    assert run_retry(retry(["order/42"]).pk).done == 2
    assert transport.counts(a).total == 1
    assert transport.counts(b).total == 1


# -- control headers belong to Sluice ------------------------------------------------------------

def test_a_producer_cannot_set_sluice_control_headers(queue, transport):
    transport.send(queue, {"n": 1}, headers={
        Headers.FAILED_ATTEMPTS: "99", Headers.TOTAL_FAILED_ATTEMPTS: "99",
        Headers.DELAYED_DESTINATION: "somewhere-else", Headers.FAILED_Q: "elsewhere",
        Headers.DELAYED_RETRIES: "7", "Sluice.RetryOf": "x", "Custom": "kept"})
    (message,) = transport.browse(queue)
    for name in (Headers.FAILED_ATTEMPTS, Headers.TOTAL_FAILED_ATTEMPTS, Headers.DELAYED_DESTINATION,
                 Headers.FAILED_Q, Headers.DELAYED_RETRIES, "Sluice.RetryOf"):
        assert name not in message.headers
    assert message.headers["Custom"] == "kept"


def test_ingestion_trusts_the_delayed_destination_only_from_the_delayed_store(make_queue, error_queue, transport):
    """A message that failed in its own queue, carrying a DelayedDestination header another
    endpoint wrote into its row, is retried into the queue it failed in."""
    victim, elsewhere = make_queue("victim"), make_queue("elsewhere")
    headers = {Headers.MESSAGE_ID: "m-1", Headers.FAILED_Q: victim, Headers.DELAYED_DESTINATION: elsewhere,
               Headers.EXCEPTION_TYPE: "ValueError"}
    transport.enqueue([transport.outgoing(error_queue, "m-1", headers, b"{}", forever=True)])
    ingest_errors()
    assert FailedMessage.objects.get(message_id="m-1").original_queue == victim


# -- deeply nested headers are poison ----------------------------------------------------------------

def test_deeply_nested_header_json_is_a_poison_message_not_a_crash():
    with pytest.raises(PoisonMessage):
        decode_headers("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PoisonMessage):
        decode_headers('{"a":' * 100_000 + "1" + "}" * 100_000)


def _as_json_loads_reads_it(text):
    """What decode_headers made of ``text`` when it parsed with json.loads: the reference."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        return "poison", f"Headers column is not valid JSON: {exc}"
    if not isinstance(value, dict):
        return "poison", f"Headers column is JSON {type(value).__name__}, not an object"
    if any(not isinstance(v, str) for v in value.values()):
        return "poison", "non-string values"
    return "ok", value


def _decoded(text):
    try:
        return "ok", decode_headers(text)
    except PoisonMessage as exc:
        message = str(exc)
        return "poison", "non-string values" if "non-string values" in message else message


_header_json = st.dictionaries(st.text(max_size=6), st.text(max_size=6) | st.integers() | st.none(), max_size=4).map(
    lambda d: json.dumps(d, ensure_ascii=False, separators=(",", ":")))


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(st.one_of(
    _header_json,  # the common case: one object, nothing around it
    st.tuples(_header_json, st.sampled_from(["", " ", "\n", "\t "]), st.sampled_from(["", " ", "\r\n", "x", "{}", ","]))
    .map(lambda v: v[1] + v[0] + v[2]),  # whitespace before or after, data after
    _header_json.map(lambda t: t[:len(t) // 2]),  # cut short
    st.text(max_size=12),  # anything at all
    st.sampled_from([None, b'{"a":"b"}', b"\xff", '["a"]', '"a"', "{", '{"a":"b"}{"c":"d"}']),
))
def test_header_text_is_read_as_json_loads_reads_it(text):
    """decode_headers reads one JSON object with json's scanner, without json.loads's
    wrapping; any text (whitespace around it, data after it, cut short, not text at all)
    comes out as json.loads would make of it: the same header map, or the same poison."""
    assert _decoded(text) == _as_json_loads_reads_it(text)


def test_a_row_with_deeply_nested_headers_goes_to_the_error_queue(queue, temp_handlers, error_queue, pump_for,
                                                                  transport):
    handled = []
    temp_handlers(queue, None, lambda m, c: handled.append(m.id))
    transport.send(queue, {"n": 1})
    _overwrite_headers(queue, "[" * 50_000 + "]" * 50_000)
    transport.send(queue, {"n": 2})

    drain(pump_for(queue))

    assert transport.counts(queue).total == 0
    assert len(handled) == 1
    assert transport.counts(error_queue).total == 1


def _overwrite_headers(queue: str, text: str) -> None:
    """What another endpoint writing rows straight into the table could leave there."""
    queue_model(queue).objects.all().update(headers=text)


def test_the_expired_purge_recreates_a_missing_dead_letter_queue(make_queue, transport):
    name = make_queue("purged", dead_letter_on_expiry=True)
    transport.send(name, {"n": 1}, ttl=0.01)
    time.sleep(0.05)
    dlq = name + DEAD_LETTER_SUFFIX
    delete_queue(dlq)

    purge_expired_messages()  # finds the dead-letter queue missing: recreates it
    purge_expired_messages()  # moves the expired message into it

    assert transport.counts(name).total == 0
    assert transport.counts(dlq).total == 1


def test_stored_operations_that_nest_too_deeply_are_unreadable_not_a_crash():
    with pytest.raises(UnreadableOperations):
        decode_operations("[" * 100_000 + "]" * 100_000)
