"""Nothing another system writes, and no exception text, stalls a queue (issue 34).

Rows written straight into a queue table by another endpoint can carry headers Sluice
reads but could not write back as they are: a lone surrogate (valid JSON, ``"\\ud800"``),
a CorrelationId longer than the column it would be copied into.  Exception text can carry
the same (a handler raising with a value from its body).  Every write that records what
happened to such a message — the processing record, the retry, the error-queue move,
failed-message ingestion — must take it, and a message behind it must be handled.
"""
from __future__ import annotations

import json
import re
import uuid

import pytest
from django.db import connection

from core.failures import ingest_errors
from core.messages import Headers
from core.models import FailedMessage, QueueKind
from core.models.records import ProcessingRecord
from core.queues import registry
from core.transport import Transport
from tests.conftest import put_raw_row
from tests.tracing_support import traced  # noqa: F401 — the fixture

#: What the issue found: valid JSON text whose value is a lone surrogate.
LONE = "\ud800"
#: The header a message set aside carries (a literal: the wire name is the promise).
POISON_REASON = "Sluice.PoisonReason"
#: The refusal of refuse_inserts' trigger as the reason and the log give it: the error's
#: class and text (PostgreSQL adds where in the trigger).
WHY = r"\w+Error: refused by a trigger(?:\nCONTEXT: [^\n]*)?\s*"


def put_foreign_row(queue: str, headers: dict[str, str], body: bytes, *, correlation_id: str | None = None,
                    reply_to: str | None = None) -> str:
    """Insert a row the way another system writing into the table does: raw SQL, its own
    header text (JSON with ``\\u`` escapes: how a lone surrogate travels as valid text).
    Returns the row's id."""
    row_id = str(uuid.uuid4())
    text = json.dumps({Headers.MESSAGE_ID: row_id, **headers})  # ensure_ascii: "\ud800" escaped
    assert text.isascii()
    table = Transport().dialect.table(queue)
    with connection.cursor() as cursor:
        cursor.execute(f'INSERT INTO {table} ("Id", "CorrelationId", "ReplyToAddress", "Headers", "Body") '
                       "VALUES (%s, %s, %s, %s, %s)", [row_id, correlation_id, reply_to, text, body])
    return row_id


def foreign_headers(message_type: str) -> dict[str, str]:
    """Headers with a lone surrogate where the processing record copies them, and where
    only the header text keeps them."""
    return {Headers.ENCLOSED_MESSAGE_TYPES: message_type, Headers.CONVERSATION_ID: f"conv-{LONE}",
            Headers.ORIGINATING_ENDPOINT: f"elsewhere-{LONE}", "Foreign.Note": f"a {LONE} b"}


def fail(message, context):
    raise ValueError(f"cannot take {message.json().get('name', 'it')}")


@pytest.fixture
def endpoint(queue, temp_handlers, error_queue, pump_for):
    """``queue`` with a Ping handler (records the n it handled) and a Fail one (raises)."""
    handled: list[int] = []
    temp_handlers(queue, "Ping", lambda message, context: handled.append(message.json()["n"]))
    temp_handlers(queue, "Fail", fail)
    pump = pump_for(queue, immediate_retries=1, delayed_retries=0, concurrency=1, receive_batch_size=10)
    return queue, handled, pump


def run(pump, times: int = 4) -> None:
    """Receive batches as a worker would, each its own transaction: a stalled queue raises
    (the receive rolls back) or keeps its row."""
    for _ in range(times):
        pump.receive_and_process(10)


def test_a_lone_surrogate_in_a_foreign_rows_header_does_not_stall_a_succeeding_handler(endpoint, transport,
                                                                                      error_queue):
    queue, handled, pump = endpoint
    bad = put_foreign_row(queue, foreign_headers("Ping"), b'{"n": 0}')
    transport.send(queue, {"n": 1}, message_type="Ping")

    run(pump, 1)

    assert handled == [0, 1]
    assert transport.counts(queue).total == 0
    assert transport.counts(error_queue).total == 0
    # The records were written: the record of the foreign row too.
    assert ProcessingRecord.objects.filter(queue=queue).count() == 2
    assert ProcessingRecord.objects.filter(queue=queue, message_id=bad).exists()


def test_a_lone_surrogate_in_a_foreign_rows_header_does_not_stall_a_failing_handler(endpoint, transport,
                                                                                   error_queue):
    queue, handled, pump = endpoint
    bad = put_foreign_row(queue, foreign_headers("Fail"), b'{"n": 0}')
    transport.send(queue, {"n": 1}, message_type="Ping")

    run(pump)

    assert handled == [1]
    assert transport.counts(queue).total == 0
    [failed] = transport.browse(error_queue, limit=10)
    # Retried, then moved with its headers exactly as they were: the surrogate round-trips.
    assert failed.id == bad and failed.headers[Headers.FAILED_ATTEMPTS] == "2"
    assert failed.headers["Foreign.Note"] == f"a {LONE} b"
    assert failed.headers[Headers.CONVERSATION_ID] == f"conv-{LONE}"
    assert "Sluice.PoisonReason" not in failed.headers
    # Ingestion takes it too: the record keeps the headers exactly.
    assert ingest_errors() == 1
    record = FailedMessage.objects.get()
    assert json.loads(record.headers)["Foreign.Note"] == f"a {LONE} b"


def test_in_outbox_mode_a_lone_surrogate_in_a_foreign_rows_header_is_handled_at_its_first_attempt(
        queue, make_queue, transport, temp_handlers, error_queue, pump_for, outbox):
    """The handler's send carries the foreign row's ConversationId on (a lone surrogate) into
    the outbox record's operations: that text must take it as the queue's headers do, or the
    handler's work rolls back and a failed attempt is counted for a handler that succeeded."""
    out = make_queue()
    runs: list[int] = []

    def relay(message, context):
        runs.append(message.json()["n"])
        context.send(out, {"echo": message.json()["n"]})

    temp_handlers(queue, "Ping", relay)
    bad = put_foreign_row(queue, foreign_headers("Ping"), b'{"n": 0}')
    transport.send(queue, {"n": 1}, message_type="Ping")
    pump = pump_for(queue, immediate_retries=1, delayed_retries=0, concurrency=1, receive_batch_size=10,
                    transaction_mode="outbox")

    pump.receive_and_process(10)

    assert runs == [0, 1]  # each handled once, at its first attempt: nothing counted, nothing redone
    assert pump.stats.retried == 0
    assert transport.counts(queue).total == 0
    assert transport.counts(error_queue).total == 0
    sent = {m.json()["echo"]: m for m in transport.browse(out, limit=10)}
    assert sorted(sent) == [0, 1]
    # The surrogate travelled on through the outbox exactly, as the default mode carries it.
    assert sent[0].headers[Headers.CONVERSATION_ID] == f"conv-{LONE}"
    assert outbox.store.states([bad])[bad][0]  # its record dispatched


def test_a_lone_surrogate_in_exception_text_does_not_stall_the_error_queue_move(endpoint, transport, error_queue):
    queue, handled, pump = endpoint
    # A normal send whose body is valid JSON with a lone surrogate in it (as text).
    sent = transport.send(queue, b'{"n": 0, "name": "\\ud800"}', message_type="Fail",
                          content_type="application/json")
    transport.send(queue, {"n": 1}, message_type="Ping")

    run(pump)

    assert handled == [1]
    assert transport.counts(queue).total == 0
    [failed] = transport.browse(error_queue, limit=10)
    assert failed.headers[Headers.MESSAGE_ID] == sent and failed.headers[Headers.FAILED_ATTEMPTS] == "2"
    assert failed.headers[Headers.EXCEPTION_MESSAGE] == f"cannot take {LONE}"
    assert "Sluice.PoisonReason" not in failed.headers
    assert ingest_errors() == 1
    record = FailedMessage.objects.get()
    assert json.loads(record.headers)[Headers.EXCEPTION_MESSAGE] == f"cannot take {LONE}"
    assert record.exception_message.startswith("cannot take ")


def test_an_over_long_correlation_id_header_is_not_copied_into_its_column(endpoint, transport, error_queue):
    # PostgreSQL refuses it (varchar(255)); SQLite would take it: the check is the same on both.
    queue, handled, pump = endpoint
    long = "c" * 300
    bad = put_foreign_row(queue, {Headers.ENCLOSED_MESSAGE_TYPES: "Fail", Headers.CORRELATION_ID: long}, b'{"n": 0}')
    transport.send(queue, {"n": 1}, message_type="Ping")

    run(pump)

    assert handled == [1]
    assert transport.counts(queue).total == 0
    [failed] = transport.browse(error_queue, limit=10)
    assert failed.id == bad and failed.headers[Headers.FAILED_ATTEMPTS] == "2"
    assert failed.headers[Headers.CORRELATION_ID] == long  # the full value stays in the headers
    assert failed.correlation_id is None                   # the column takes what fits, or nothing
    assert "Sluice.PoisonReason" not in failed.headers


# -- the last resort: a write the database refuses anyway ----------------------------------------

@pytest.fixture
def refuse_inserts(transactional_db):
    """``refuse_inserts(queue, like)``: a trigger on ``queue``'s table refusing rows whose
    header text is LIKE ``like`` — a database-side rule no check in Sluice can foresee.
    Dropped after the test (the error queue's table outlives it)."""
    made: list[tuple[str, str]] = []

    def refuse(queue: str, like: str) -> None:
        table, name = Transport().dialect.table(queue), f"refuse_{uuid.uuid4().hex[:8]}"
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"""CREATE FUNCTION {name}() RETURNS trigger AS $$
                    BEGIN IF NEW."Headers" LIKE '{like}' THEN RAISE EXCEPTION 'refused by a trigger'; END IF;
                    RETURN NEW; END $$ LANGUAGE plpgsql""")
                cursor.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()")
            else:
                cursor.execute(f"""CREATE TRIGGER {name} BEFORE INSERT ON {table}
                    WHEN NEW."Headers" LIKE '{like}' BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END""")
        made.append((table, name))

    yield refuse
    with connection.cursor() as cursor:
        for table, name in made:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
                cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {name}")


def test_a_refused_retry_sets_the_message_aside_as_received_and_the_batch_commits(endpoint, transport, error_queue,
                                                                                refuse_inserts, caplog):
    queue, handled, pump = endpoint
    refuse_inserts(queue, "%Sluice.FailedAttempts%")  # the retry's re-insert, never a first send
    bad = put_foreign_row(queue, {**foreign_headers("Fail"), "Foreign.Order": "1"}, b'{"n": 0}',
                          correlation_id="corr-7", reply_to="their-replies")
    raw = queue_text(queue, bad)
    transport.send(queue, {"n": 1}, message_type="Ping")

    with caplog.at_level("INFO", logger="sluice"):
        run(pump, 1)  # one receive: the failure is recorded, the good message committed

    assert handled == [1]
    assert transport.counts(queue).total == 0
    [aside] = transport.browse(error_queue, limit=10)
    assert aside.id == bad and aside.body == b'{"n": 0}'
    assert (aside.correlation_id, aside.reply_to) == ("corr-7", "their-replies")  # its columns too
    reason = aside.headers.pop(POISON_REASON)
    assert re.fullmatch(rf"the database refused the immediate retry's re-insert: {WHY}", reason), reason
    assert aside.headers == json.loads(raw)  # as it was received: no failure headers, no counts
    assert aside.raw_headers.startswith(raw[:-1])  # its text kept, the reason added at the end
    # One ERROR an operator can act on: the message, its queue, the refused write and why,
    # and where the message went.
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert re.fullmatch(rf"message {bad} on {queue}: the database refused the immediate retry's re-insert "
                        rf"\({WHY}\); moved as received to {error_queue} with {POISON_REASON}", error), error
    assert not [r for r in caplog.records if r.levelname == "WARNING" and r.name == "sluice.pump"]


def test_a_message_whose_raw_move_is_refused_too_is_parked_and_logged_once(endpoint, transport, error_queue,
                                                                          refuse_inserts, caplog):
    from core.queues import delete_queue

    queue, handled, pump = endpoint
    refuse_inserts(queue, "%Sluice.FailedAttempts%")
    refuse_inserts(error_queue, "%")  # the error queue takes nothing
    bad = put_foreign_row(queue, foreign_headers("Fail"), b'{"n": 0}')
    transport.send(queue, {"n": 1}, message_type="Ping")
    parked = error_queue + ".parked"
    try:
        with caplog.at_level("INFO", logger="sluice"):
            run(pump)

        assert handled == [1]
        assert transport.counts(queue).total == 0
        assert transport.counts(error_queue).total == 0
        [aside] = [m for m in transport.browse(parked, limit=100) if m.id == bad]  # (a killed run may leave others)
        assert aside.id == bad and aside.body == b'{"n": 0}'
        reason = aside.headers[POISON_REASON]
        assert re.fullmatch(rf"the database refused the immediate retry's re-insert: {WHY}; "
                            rf"then the raw move to {error_queue}: {WHY}", reason), reason
        assert registry.get(parked).kind == QueueKind.ERROR  # never received from, shown as an error queue
        [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert re.fullmatch(rf"message {bad} on {queue}: the database refused the immediate retry's re-insert "
                            rf"\({WHY}\) and the raw move to {error_queue}: {WHY}; parked in {parked}", error), error
    finally:
        delete_queue(parked)


def test_a_refused_dead_letter_move_of_an_expired_message_sets_it_aside(make_queue, transport, temp_handlers,
                                                                       pump_for, error_queue, refuse_inserts,
                                                                       traced, caplog):
    """An expired message whose queue dead-letters expired messages, and a dead-letter queue
    that refuses it: the message is set aside like any other whose outcome cannot be
    written, its record and span say "expired" and "set aside", and the message behind it
    is handled."""
    queue = make_queue(dead_letter_on_expiry=True)
    handled: list[bytes] = []
    temp_handlers(queue, None, lambda message, context: handled.append(message.body))
    refuse_inserts(queue + ".deadletter", "%")
    late = transport.send(queue, b"too late", ttl=0)
    transport.send(queue, b"in time")
    with caplog.at_level("INFO", logger="sluice"):
        run(pump_for(queue, concurrency=1, receive_batch_size=10), 1)

    assert handled == [b"in time"] and transport.counts(queue).total == 0
    assert transport.counts(queue + ".deadletter").total == 0
    [aside] = transport.browse(error_queue, limit=10)
    assert aside.id == late and aside.body == b"too late"
    reason = aside.headers[POISON_REASON]
    assert re.fullmatch(rf"the database refused the expired message's dead-letter move: {WHY}", reason), reason
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert re.fullmatch(rf"message {late} on {queue}: the database refused the expired message's dead-letter move "
                        rf"\({WHY}\); moved as received to {error_queue} with {POISON_REASON}", error), error
    assert ProcessingRecord.objects.get(message_id=late).outcome == "expired"
    [span] = [s for s in traced.spans(f"process {queue}") if s.attributes["messaging.message.id"] == late]
    assert [(e.name, dict(e.attributes)) for e in span.events] == [
        ("sluice.expired", {"sluice.expiry.action": "set aside"})]


def test_a_message_set_aside_with_an_empty_header_object_keeps_readable_headers(endpoint, transport, error_queue,
                                                                                refuse_inserts):
    """``{}`` as the header text (no type: it goes to the error queue), its move refused: the
    row set aside carries the reason alone, as a readable header object."""
    queue, handled, pump = endpoint
    refuse_inserts(error_queue, "%ExceptionInfo%")  # the move with its failure headers, not the raw one
    bad = put_raw_row(queue, "{}", b"{}")
    transport.send(queue, {"n": 1}, message_type="Ping")

    run(pump)

    assert handled == [1] and transport.counts(queue).total == 0
    [aside] = transport.browse(error_queue, limit=10)
    assert aside.id == bad and not aside.poison
    assert list(aside.headers) == [POISON_REASON] and "refused by a trigger" in aside.headers[POISON_REASON]


def test_a_poison_row_with_braces_is_parked_with_its_text_kept_whole(endpoint, transport, error_queue,
                                                                      refuse_inserts):
    """Header text that looks like an object but is no JSON (``{oops}``): a poison row.  Its
    move to the error queue and its raw move refused, it is parked with the text whole in
    ``Sluice.RawHeaders`` (not spliced into, which would make the parked row unreadable)."""
    from core.queues import delete_queue

    queue, handled, pump = endpoint
    refuse_inserts(error_queue, "%")
    bad = put_raw_row(queue, "{oops}", b"{}")
    transport.send(queue, {"n": 1}, message_type="Ping")
    parked = error_queue + ".parked"
    try:
        run(pump)

        assert handled == [1] and transport.counts(queue).total == 0
        [aside] = [m for m in transport.browse(parked, limit=100) if m.id == bad]  # (a killed run may leave others)
        assert aside.id == bad and not aside.poison
        assert aside.headers["Sluice.RawHeaders"] == "{oops}"
        assert re.fullmatch(rf"the database refused the poison row's move to the error queue: {WHY}; "
                            rf"then the raw move to {error_queue}: {WHY}", aside.headers[POISON_REASON])
    finally:
        delete_queue(parked)



@pytest.mark.postgresql
def test_a_transient_error_at_a_recording_write_rolls_the_batch_back_and_sets_nothing_aside(endpoint, transport,
                                                                                           error_queue):
    """A deadlock reported at the retry's re-insert is the database's state, not the
    message's: the batch rolls back to be received again (the breaker counts it), nothing is
    set aside, and once the database takes writes again the failure is recorded as usual."""
    from django.db import DatabaseError

    queue, handled, pump = endpoint
    table, name = transport.dialect.table(queue), f"deadlock_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"""CREATE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN IF NEW."Headers" LIKE '%Sluice.FailedAttempts%' THEN
              RAISE EXCEPTION 'deadlock detected (a test)' USING ERRCODE = '40P01'; END IF;
            RETURN NEW; END $$ LANGUAGE plpgsql""")
        cursor.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        failing = transport.send(queue, {"n": 0}, message_type="Fail")
        with pytest.raises(DatabaseError, match="deadlock detected"):
            pump.receive_and_process(10)
        assert transport.counts(queue).total == 1 and transport.counts(error_queue).total == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")
    pump.receive_and_process(10)  # the retry's re-insert goes through now
    [again] = transport.browse(queue, limit=10)
    assert again.id == failing and again.headers[Headers.FAILED_ATTEMPTS] == "1"
    assert POISON_REASON not in again.headers

def queue_text(queue: str, row_id: str) -> str:
    """The Headers column's text of a row, as the database holds it."""
    [message] = [m for m in Transport().browse(queue, limit=100) if m.id == row_id]
    return message.raw_headers


# -- suspicions of issue 34, settled -------------------------------------------------------------

@pytest.mark.postgresql
def test_a_transient_error_at_the_flush_is_not_counted_as_the_messages_failed_attempt(queue, make_queue, transport,
                                                                                     temp_handlers, pump_for):
    """A statement timeout (a transient error: the database's state, not the message's) while
    a chunk's sends are inserted rolls the batch back to be received again, uncounted — it
    is not the message's own failed attempt, as a refusal for content is."""
    from django.db import DatabaseError

    from tests.conftest import open_transaction

    out = make_queue()

    def handle(message, context):
        with connection.cursor() as cursor:  # undone by the chunk's savepoint, with everything else
            cursor.execute("SET LOCAL statement_timeout = '300ms'")
        context.send(out, {"echo": 1})

    temp_handlers(queue, "Ping", handle)
    transport.send(queue, {"n": 1}, message_type="Ping")
    pump = pump_for(queue, immediate_retries=3, concurrency=1)
    table = transport.dialect.table(out)

    def lock() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

    with open_transaction(lock):
        with pytest.raises(DatabaseError):
            pump.receive_and_process(1)

    [back] = transport.browse(queue, limit=10)
    assert Headers.FAILED_ATTEMPTS not in back.headers  # not counted
    assert pump.stats.retried == 0
    pump.receive_and_process(1)
    assert [m.json() for m in transport.browse(out, limit=10)] == [{"echo": 1}]


def test_a_handler_that_swallows_a_database_error_fails_itself_not_the_next_message(
        queue, transport, temp_handlers, error_queue, pump_for, caplog):
    """A handler catches a database error without an ``atomic()`` of its own.  On PostgreSQL
    the error has aborted the transaction (every later statement is refused until a
    rollback): the handler's failure is its own, counted on its message — the message after
    it in the chunk is not blamed, and the batch commits instead of looping.  On SQLite a
    failed statement leaves the transaction usable: the handler succeeded."""
    from django.db import DatabaseError

    handled: list[int] = []

    def swallow(message, context):
        handled.append(message.json()["n"])
        with connection.cursor() as cursor:
            try:
                cursor.execute("SELECT * FROM no_such_table_here")
            except DatabaseError:
                pass  # swallowed: on PostgreSQL, the transaction is now unusable

    temp_handlers(queue, "Swallow", swallow)
    def ping(message, context):
        with connection.cursor() as cursor:  # refused in an aborted transaction: it would be blamed
            cursor.execute("SELECT 1")
        handled.append(message.json()["n"])

    temp_handlers(queue, "Ping", ping)
    bad = transport.send(queue, {"n": 0}, message_type="Swallow")
    transport.send(queue, {"n": 1}, message_type="Ping")
    pump = pump_for(queue, immediate_retries=1, delayed_retries=0, concurrency=1, receive_batch_size=10)

    for _ in range(3):
        pump.receive_and_process(10)

    assert transport.counts(queue).total == 0  # no loop: both settled
    assert handled.count(1) == 1 and ProcessingRecord.objects.filter(queue=queue).exists()
    assert pump.stats.retried + pump.stats.errored == (2 if connection.vendor == "postgresql" else 0)
    if connection.vendor == "postgresql":
        assert handled.count(0) == 2  # its two attempts, then the error queue
        [failed] = transport.browse(error_queue, limit=10)
        assert failed.headers[Headers.MESSAGE_ID] == bad
        assert "aborted" in failed.headers[Headers.EXCEPTION_MESSAGE]
    else:
        assert handled.count(0) == 1 and transport.counts(error_queue).total == 0
