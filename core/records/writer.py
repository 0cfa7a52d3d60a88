"""The pump's record writer: a receive batch's records in one statement (COPY or a multi-row INSERT).

The pump calls one method per decision (processed, failed/retried, expired or
dead-lettered, moved to the error queue) while it processes a batch, then
:meth:`RecordBatch.write` once, inside the receive's transaction: the records commit
with the receive and vanish with its rollback (the messages are back in their queue,
and will be recorded when they are handled again).
"""
from __future__ import annotations

import calendar
import functools
import time
from typing import Sequence

from django.db import DatabaseError, connections

from core.conf import get_settings
from core.db import StatementCursor
from core.runtime.health import worker_name
from core.messages import Headers, Message, enclosed_types, storable_text
from core.queues import dialect
from core.models.records import ProcessingRecord
from pipeline import schema

COLUMNS = ("message_id", "message_type", "queue", "endpoint", "time_sent_us", "started_us", "ended_us",
           "outcome", "attempt", "deliver_at_us", "conversation_id", "related_to", "correlation_id", "intent",
           "originating_endpoint", "originating_host", "worker", "trace_id")
_FIELDS = [ProcessingRecord._meta.get_field(name) for name in COLUMNS]
_LIMITS = {field.name: field.max_length for field in _FIELDS if field.max_length}
#: NServiceBus.MessageIntent values kept as they are (lower case); others read as "send".
_INTENTS = {"send": "send", "publish": "publish", "reply": "reply"}


def now_us() -> int:
    """Wall-clock time in integer microseconds since the epoch (UTC)."""
    return time.time_ns() // 1000


def intent_of(headers: dict[str, str]) -> str:
    """What kind of delivery this was: a retry (an operator's, or a delayed retry of the
    recoverability policy), a delayed send, or the sender's ``NServiceBus.MessageIntent``
    (send, publish, reply)."""
    if Headers.RETRY_OF in headers or Headers.DELAYED_RETRIES in headers:
        return "retry"
    if Headers.DELIVER_AT in headers:
        return "delayed"
    return _INTENTS.get((headers.get(Headers.MESSAGE_INTENT) or "").lower(), "send")


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``), or None."""
    if not traceparent or len(traceparent) < 35 or traceparent[2] != "-":
        return None
    trace_id = traceparent[3:35].lower()
    if trace_id == "0" * 32 or any(c not in "0123456789abcdef" for c in trace_id):
        return None
    return trace_id


#: The lengths of the columns copied from headers (cut to fit).
_MESSAGE_ID, _MESSAGE_TYPE, _CONVERSATION, _RELATED, _CORRELATION, _ENDPOINT, _HOST = (
    _LIMITS[name] for name in ("message_id", "message_type", "conversation_id", "related_to", "correlation_id",
                               "originating_endpoint", "originating_host"))


@functools.lru_cache(maxsize=1024)
def sent_us(text: str | None) -> int | None:
    """``NServiceBus.TimeSent`` or ``DeliverAt`` (``2026-11-22 04:15:16:123456 Z``) in microseconds, or None
    when missing or unreadable.  By hand, not strptime, and cached: this runs up to three
    times per message (its processing record, then its critical time when tracing is on)."""
    if not text or len(text) < 19:
        return None
    seconds = _whole_seconds(text[:19])
    if seconds is None:
        return None
    fraction = text[20:].split(" ", 1)[0] if len(text) > 20 else ""
    return seconds * 1_000_000 + (int(fraction.ljust(6, "0")[:6]) if fraction.isdigit() else 0)


@functools.lru_cache(maxsize=256)
def _whole_seconds(text: str) -> int | None:
    """``2026-11-22 04:15:16`` as seconds since the epoch (UTC).  Cached: the messages of a
    receive batch were mostly sent within the same few seconds."""
    try:
        return calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]),
                                int(text[11:13]), int(text[14:16]), int(text[17:19]), 0, 0, 0))
    except ValueError:
        return None


class RecordBatch:
    """The records of one receive batch (see the module docstring)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.worker = worker_name()
        self.rows: list[tuple] = []

    # -- one call per decision point of the pump ---------------------------------------------
    # ``trace_id``: the trace the message's process span belongs to when it is not the one
    # its traceparent names (a delayed delivery's or a retry's new trace); None: that one.
    def processed(self, message: Message, started_us: int, trace_id: str | None = None) -> None:
        self._add(message, schema.PROCESSED, started_us, trace_id=trace_id)

    def processed_all(self, messages: Sequence[Message], started_us: int, trace_id: str | None = None) -> None:
        """The messages one handler call processed together (a batch handler): each gets
        an equal share of the call's time, so a batch of 100 taking 50 ms records 0.5 ms
        per message, not 50 (processing-time percentiles stay per message)."""
        if len(messages) == 1:
            self.processed(messages[0], started_us, trace_id)
            return
        share = (now_us() - started_us) // len(messages)
        for message in messages:
            self._add(message, schema.PROCESSED, None, share, trace_id)

    def handler_failed(self, message: Message, decision: str, started_us: int | None,
                       trace_id: str | None = None) -> None:
        """``decision`` is Recoverability.on_failure's: "error" means this was the last attempt."""
        self._add(message, schema.FAILED if decision == "error" else schema.RETRIED, started_us, trace_id=trace_id)

    def expired(self, message: Message, action: str, trace_id: str | None = None) -> None:
        """``action`` is core.expiry.on_expired_receive's ("dead-lettered" or dropped)."""
        self._add(message, schema.DEAD_LETTERED if action == "dead-lettered" else schema.EXPIRED, trace_id=trace_id)

    def to_error_queue(self, message: Message, trace_id: str | None = None) -> None:
        """A poison row or a message nobody handles: no handler ran."""
        self._add(message, schema.ERROR_QUEUE, trace_id=trace_id)

    # -- a chunk's savepoint (core.receive.pump): its records go when it rolls back ---------------------
    def mark(self) -> int:
        return len(self.rows)

    def rollback_to(self, mark: int) -> None:
        del self.rows[mark:]

    # -----------------------------------------------------------------------------------------
    def _add(self, message: Message, outcome: str, started: int | None = None, took: int | None = None,
             trace_id: str | None = None) -> None:
        ended = now_us()
        if took is not None:
            started = ended - took
        headers = message.headers  # empty for a poison row
        get = headers.get
        types = enclosed_types(get(Headers.ENCLOSED_MESSAGE_TYPES) or "")  # most specific first
        # Copied headers cut to their columns' lengths (inline, not a call per column:
        # this runs for every message handled).
        conversation, related, correlation = (get(Headers.CONVERSATION_ID), get(Headers.RELATED_TO),
                                              get(Headers.CORRELATION_ID) or message.correlation_id)
        endpoint, host = get(Headers.ORIGINATING_ENDPOINT), get(Headers.ORIGINATING_MACHINE)
        self.rows.append((
            get(Headers.MESSAGE_ID, message.id)[:_MESSAGE_ID],
            types[0][:_MESSAGE_TYPE] if types and types[0] else None,
            message.queue,
            self.endpoint,
            sent_us(get(Headers.TIME_SENT)),
            ended if started is None else started,
            ended,
            outcome,
            message.total_failed_attempts + 1,
            sent_us(get(Headers.DELIVER_AT)),
            conversation[:_CONVERSATION] if conversation else None,
            related[:_RELATED] if related else None,
            correlation[:_CORRELATION] if correlation else None,
            intent_of(headers),
            endpoint[:_ENDPOINT] if endpoint else None,
            host[:_HOST] if host else None,
            self.worker,
            trace_id or trace_id_of(get(Headers.TRACEPARENT)),
        ))

    def write(self, using: str) -> int:
        """INSERT the batch's records on ``using`` (the receive's connection, inside its
        transaction): one statement, or a few where the database caps parameters."""
        if not self.rows:
            return 0
        try:
            insert_rows(self.rows, using)
        except (ValueError, DatabaseError):
            # A value copied from another system's header that the driver cannot send (a
            # lone surrogate, a NUL): refused before the statement left, so the transaction
            # is intact.  Written again with those characters replaced; refused again (the
            # database itself, not a value), the batch fails as it would have.
            storable = [tuple(storable_text(v) if type(v) is str else v for v in row) for row in self.rows]
            if storable == self.rows:
                raise
            insert_rows(storable, using)
        written, self.rows = len(self.rows), []
        return written


#: The COPY statement's text per database alias (insert_rows).
_copy_sql: dict[str, str] = {}


def insert_rows(rows: Sequence[tuple], using: str) -> None:
    """INSERT ``rows`` (tuples in :data:`COLUMNS` order): one ``COPY … FROM STDIN`` where
    the dialect has it (PostgreSQL), else multi-row VALUES, as many rows per statement as
    Django's own per-database parameter limit allows (SQLite, SQL Server's 2,100).  A row
    may stop after ``deliver_at_us`` (the first ten columns, as bulk loaders and older
    callers write them): the conversation and worker columns are then NULL."""
    if any(len(row) < len(COLUMNS) for row in rows):
        rows = [tuple(row) + (None,) * (len(COLUMNS) - len(row)) for row in rows]
    conn = connections[using]
    d = dialect(using)
    table = conn.ops.quote_name(ProcessingRecord._meta.db_table)
    if d.supports_copy_in:
        sql = _copy_sql.get(using)
        if sql is None:  # once per alias: this runs for every receive batch
            sql = _copy_sql[using] = d.copy_in(table, COLUMNS)
        with StatementCursor(using) as cursor:
            cursor.copy_in(sql, rows)
        return
    head = f"INSERT INTO {table} ({', '.join(conn.ops.quote_name(c) for c in COLUMNS)}) VALUES "
    one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    step = max(1, conn.ops.bulk_batch_size(_FIELDS, rows))
    with conn.cursor() as cursor:
        for i in range(0, len(rows), step):
            chunk = rows[i:i + step]
            cursor.execute(head + ", ".join([one] * len(chunk)), [v for row in chunk for v in row])


class NoRecords:
    """SLUICE_PROCESSING_RECORDS off: every call does nothing."""

    def processed(self, message: Message, started_us: int, trace_id: str | None = None) -> None:
        pass

    def processed_all(self, messages: Sequence[Message], started_us: int, trace_id: str | None = None) -> None:
        pass

    def handler_failed(self, message: Message, decision: str, started_us: int | None,
                       trace_id: str | None = None) -> None:
        pass

    def mark(self) -> int:
        return 0

    def rollback_to(self, mark: int) -> None:
        pass

    def expired(self, message: Message, action: str, trace_id: str | None = None) -> None:
        pass

    def to_error_queue(self, message: Message, trace_id: str | None = None) -> None:
        pass

    def write(self, using: str) -> int:
        return 0


def start_batch() -> RecordBatch | NoRecords:
    """A batch's record writer, or a do-nothing one when records are switched off."""
    settings = get_settings()
    return RecordBatch(settings.ENDPOINT) if settings.PROCESSING_RECORDS else NoRecords()
