"""Outgoing rows: the value :meth:`core.transport.Transport.enqueue` inserts, the checks a
new message passes, the batch builder behind ``send_many``, and :class:`MessageBuilder`,
which makes rows from a new message's arguments (Transport's build / build_many / outgoing).

Kept apart from core/transport/ (which re-exports these names) so the per-message
work of a batch is in one place: a batch of 1,000 messages with the same options is
validated once, and each message then costs its body, two fresh ids and a copy of the
first message's headers.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from core.conf import get_settings
from core.errors import BodyTooLarge, InvalidMessage
from core.messages import Headers, encode_headers, parse_timespan, producer_headers, timespan, wire_time
from core.queues import QueueInfo, registry, validate_name, validate_ttl
from core.tracing import state as tracing_state
from core.tracing.propagation import inject as inject_trace_context

#: Namespace for turning a non-UUID message id into the table's uuid Id column.
ID_NAMESPACE = uuid.UUID("5f1a7c2e-8b0d-4f57-9a52-3c1e5d0b7a11")
MAX_MESSAGE_ID_LENGTH = 200
#: The width of the CorrelationId and ReplyToAddress columns.
MAX_ADDRESS_LENGTH = 255
_CONTROL = re.compile(r"[\x00-\x1f]")
#: What the CorrelationId / ReplyToAddress columns refuse besides length: control
#: characters (PostgreSQL takes no NUL) and surrogates (no driver can encode one).
_NOT_IN_COLUMN = re.compile("[\x00-\x1f\ud800-\udfff]")
#: One encoder for every JSON body: json.dumps() with options builds a new one per call.
#: NaN and infinities are refused: json writes them as bare words no other JSON reader takes.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _compact_json() -> Callable[[Any], str]:
    """``_JSON.encode``, a third of its cost: ``JSONEncoder.encode`` builds json's C encoder
    anew on every call (1.7 of its 2.4 µs for a small body); this builds it once.  The
    same text and the same errors (``tests/test_send_many.py`` compares them on any JSON
    value); ``_JSON.encode`` itself where this Python has no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSON.encode
    try:
        # No markers: a value that contains itself recurses until RecursionError, and then
        # json's own encoder says so (ValueError), as it did before.
        chunks = make(None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)
    except TypeError:  # another C signature than 3.11–3.13's
        return _JSON.encode
    join = "".join

    def encode(value: Any) -> str:
        try:
            return join(chunks(value, 0))
        except RecursionError:
            return _JSON.encode(value)

    return encode


_to_json = _compact_json()


def json_text(value: Any) -> str:
    """The JSON text ``send()`` writes for a body of JSON values (compact, non-ASCII kept);
    ValueError / TypeError when ``value`` is not JSON (NaN and infinities included).  For
    a caller that builds a body from parts it encoded (Sluice's task backend)."""
    return _to_json(value)


class ProducerHeaders(dict):
    """Headers already checked as :meth:`MessageBuilder.build` checks a sender's headers
    (a flat string → string map, no control headers): build takes them as they are.  For a
    caller that sends the same headers many times (a task's), made once by
    :func:`producer_headers_checked`; not to be changed afterwards."""


def producer_headers_checked(headers: Mapping[str, str]) -> ProducerHeaders:
    """``headers`` checked once for many sends (:class:`ProducerHeaders`); InvalidHeaders
    when they are not a flat string → string map."""
    encode_headers(headers)
    return ProducerHeaders(producer_headers(headers))


#: The variant nibble of an RFC 4122 UUID (10xx) for each random hex digit.
_VARIANT = {h: "89ab"[int(h, 16) & 3] for h in "0123456789abcdef"}


@dataclass(slots=True)
class OutgoingMessage:
    """A row ready for its queue table: what :meth:`Transport.enqueue` inserts.  Not to be
    changed once made (not frozen: a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__``, a fifth of the Python cost of a message in a batch).

    Made by :meth:`Transport.build` (a new message, validated), :meth:`Transport.outgoing`
    (headers already complete: the delayed mover, failed-message retries, the outbox)
    or :meth:`Transport.move` (a received message into another queue)."""

    queue: str
    row_id: str
    headers: dict[str, str]
    body: bytes
    correlation_id: str | None
    reply_to: str | None
    #: Expires = the database's now + this many seconds (None: see ``expires``).
    ttl_seconds: float | None
    #: An absolute Expires kept from a received row (an immediate retry keeps its expiry);
    #: used only when ``ttl_seconds`` is None.  None and no TTL: the row never expires.
    expires: dt.datetime | None = None
    #: ``headers`` already encoded (the batch builder makes it from a template); None:
    #: enqueue encodes them.
    headers_json: str | None = field(default=None, compare=False, repr=False)

    @property
    def message_id(self) -> str:
        return self.headers[Headers.MESSAGE_ID]

    def encoded_headers(self) -> str:
        return self.headers_json if self.headers_json is not None else encode_headers(self.headers)


def encode_body(body: Any, content_type: str | None) -> tuple[bytes, str]:
    """Bytes and content type for a body given as bytes, text or a JSON-able value."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), content_type or "application/octet-stream"
    if isinstance(body, str):
        return body.encode("utf-8"), content_type or "text/plain"
    return json_body(body), content_type or "application/json"


def json_body(body: Any) -> bytes:
    """A JSON-able body's bytes; InvalidMessage when it is not JSON-able."""
    try:
        return _to_json(body).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"body must be bytes, text or JSON-serialisable: {exc}") from None


def validate_message_id(message_id: Any) -> str:
    """The message id if it is 1–200 printable characters; InvalidMessage otherwise."""
    if not isinstance(message_id, str) or not message_id.strip() or len(message_id) > MAX_MESSAGE_ID_LENGTH \
            or _CONTROL.search(message_id):
        raise InvalidMessage(
            f"message id must be 1–{MAX_MESSAGE_ID_LENGTH} printable characters, not {message_id!r}"
        )
    return message_id


def validate_columns(headers: Mapping[str, str]) -> None:
    """InvalidMessage for header values the database would refuse at insert time, where it
    would fail the whole transaction (a handler's sends fail its receive batch): the
    CorrelationId / ReplyToAddress columns hold at most 255 printable characters (and
    PostgreSQL takes no NUL in text).  Other headers travel JSON-encoded, where control
    characters are escaped, so any string is safe there."""
    for name in (Headers.CORRELATION_ID, Headers.REPLY_TO_ADDRESS):
        value = headers.get(name)
        if value is not None and not valid_correlation_id(value):
            raise InvalidMessage(f"{name} must be at most {MAX_ADDRESS_LENGTH} printable characters "
                                 f"(no control characters), not {value[:60]!r}{'…' if len(value) > 60 else ''}")


def valid_correlation_id(value: str) -> bool:
    """Whether the CorrelationId column takes ``value`` (see :func:`validate_columns`)."""
    return len(value) <= MAX_ADDRESS_LENGTH and not _NOT_IN_COLUMN.search(value)


def column_value(value: str | None) -> str | None:
    """A header's value as its CorrelationId / ReplyToAddress column takes it: the value
    when it fits, else None.  For rows made from headers nobody validated (another
    system's row, a stored delayed message, a failed-message record): the column is a
    copy for SQL readers, the header is the message's own, and keeps the full value.
    Copying a value the column refuses would refuse the whole write (issue 34)."""
    return value if value is None or valid_correlation_id(value) else None


def row_id_for(message_id: str) -> str:
    """The uuid for the Id column: the message id itself when it is a UUID."""
    try:
        return str(uuid.UUID(message_id))
    except ValueError:
        return str(uuid.uuid5(ID_NAMESPACE, message_id))


def new_ids(count: int) -> list[str]:
    """``count`` new time-ordered (version 7, RFC 9562) UUIDs in their canonical text form:
    48 bits of Unix milliseconds, 12 of the fraction of the millisecond, then 62 random bits,
    from one clock read and one read of the system's random source.

    Why not random (version 4) ids: a processing record's message_id and conversation_id,
    an outbox row's key and a task's result row are B-tree keys.  A random key lands on a
    random leaf of a large index, and after each checkpoint the first change to a leaf
    writes the whole 8 kB page to the WAL; ids that grow with time append at the right
    edge.  With a million records in the table, records cost 5,749 WAL bytes and 33.5 µs
    of database CPU per row with random ids, 730 and 20 µs with these
    (docs/benchmarks.md).  Ids made later sort after ids made earlier, as text and as
    uuids; the ids of one call share their time and differ in their random bits."""
    now = time.time_ns()
    ms, fraction = divmod(now, 1_000_000)
    stamp = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7{fraction * 4096 // 1_000_000:03x}-"
    raw = os.urandom(8 * count).hex()
    return [f"{head}{_VARIANT[raw[i]]}{raw[i + 1:i + 4]}-{raw[i + 4:i + 16]}" for i in range(0, 16 * count, 16)]


def new_id() -> str:
    """One new message id (see :func:`new_ids`)."""
    return new_ids(1)[0]


def like_first(first: OutgoingMessage, bodies: Sequence[Any], *, content_type: str | None,
               max_body_bytes: int, options_headers: Mapping[str, str] | None,
               correlation_id: str | None) -> list[OutgoingMessage | Any]:
    """Messages for ``bodies`` made like ``first`` (built and validated with the same
    options): its headers with fresh MessageId (and the CorrelationId that follows it)
    and ConversationId, and its JSON headers with those values swapped in.  A body whose
    content type differs from the first's comes back as it is, for the caller to build
    the long way.  TimeSent is the first's: one send call, one time."""
    headers = first.headers
    given = options_headers or {}
    follows_id = correlation_id is None and Headers.CORRELATION_ID not in given
    new_conversation = Headers.CONVERSATION_ID not in given
    fixed_type = content_type is not None or Headers.CONTENT_TYPE in given
    first_type = headers.get(Headers.CONTENT_TYPE)
    # Random markers stand for the per-message values in the JSON template; 32 hex
    # digits need no escaping and cannot turn up in other headers by chance.
    id_mark, conversation_mark = uuid.uuid4().hex, uuid.uuid4().hex
    marked = {**headers, Headers.MESSAGE_ID: id_mark}
    if follows_id:
        marked[Headers.CORRELATION_ID] = id_mark
    if new_conversation:
        marked[Headers.CONVERSATION_ID] = conversation_mark
    # The template as a format string: each message's JSON is one format() call with its
    # ids (the JSON's own braces doubled; the markers are hex digits, so have none).
    template = encode_headers(marked).replace("{", "{{").replace("}", "}}")
    template = template.replace(id_mark, "{0}").replace(conversation_mark, "{1}")
    ids = new_ids(len(bodies) * 2)
    out: list[OutgoingMessage | Any] = []
    queue, reply_to, ttl = first.queue, first.reply_to, first.ttl_seconds
    fixed_correlation = first.correlation_id
    message_key, correlation_key, conversation_key = (Headers.MESSAGE_ID, Headers.CORRELATION_ID,
                                                      Headers.CONVERSATION_ID)
    dicts_are_json = content_type is None and first_type == "application/json"
    for i, body in enumerate(bodies):
        if dicts_are_json and type(body) is dict:
            data = json_body(body)  # what encode_body makes of it, without its type tests
        else:
            data, ctype = encode_body(body, content_type)
            if not fixed_type and ctype != first_type:
                out.append(body)
                continue
        if len(data) > max_body_bytes:
            raise BodyTooLarge(f"body is {len(data)} bytes; SLUICE_MAX_BODY_BYTES allows {max_body_bytes}")
        message_id, conversation_id = ids[2 * i], ids[2 * i + 1]
        h = headers.copy()
        h[message_key] = message_id
        if follows_id:
            h[correlation_key] = message_id
        if new_conversation:
            h[conversation_key] = conversation_id
        out.append(OutgoingMessage(queue, message_id, h, data, message_id if follows_id else fixed_correlation,
                                   reply_to, ttl, None, template.format(message_id, conversation_id)))
    return out


#: NServiceBus.OriginatingMachine of every send from this process.
HOST = socket.gethostname()


class MessageBuilder:
    """Making rows for queue tables on the database alias ``using``: new messages validated
    (:meth:`build`, :meth:`build_many`) and rows from complete headers (:meth:`outgoing`).
    :class:`core.transport.Transport` is one; nothing here touches a queue table."""

    using: str

    def _queue(self, name: str) -> QueueInfo:
        validate_name(name)
        return registry.get(name, self.using)

    def build(
        self,
        queue: str,
        body: Any,
        *,
        message_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        ttl: Any = None,
        content_type: str | None = None,
    ) -> OutgoingMessage:
        """Validate everything about a new message without touching its queue table."""
        settings = get_settings()
        data, ctype = encode_body(body, content_type)
        if len(data) > settings.MAX_BODY_BYTES:
            raise BodyTooLarge(
                f"body is {len(data)} bytes; SLUICE_MAX_BODY_BYTES allows {settings.MAX_BODY_BYTES}"
            )
        new_message_id, conversation_id = new_ids(2)
        message_id = validate_message_id(new_message_id if message_id is None else message_id)
        if message_type is not None and (not isinstance(message_type, str) or not message_type.strip()):
            raise InvalidMessage(f"message type must be a non-empty string, not {message_type!r}")
        all_headers: dict[str, str] = {
            Headers.MESSAGE_ID: message_id,
            Headers.CORRELATION_ID: correlation_id or message_id,
            Headers.CONVERSATION_ID: conversation_id,
            Headers.CONTENT_TYPE: ctype,
            Headers.TIME_SENT: wire_time(dt.datetime.now(dt.timezone.utc)),
            Headers.ORIGINATING_ENDPOINT: settings.ENDPOINT,
            Headers.ORIGINATING_MACHINE: HOST,
            Headers.MESSAGE_INTENT: "Send",
        }
        if headers is not None:
            if type(headers) is not ProducerHeaders:
                headers = producer_headers_checked(headers)  # validates: flat string → string
            all_headers.update(headers)
        all_headers[Headers.MESSAGE_ID] = message_id
        if message_type is not None:
            all_headers[Headers.ENCLOSED_MESSAGE_TYPES] = message_type
        if correlation_id is not None:
            all_headers[Headers.CORRELATION_ID] = correlation_id
        if reply_to is not None:
            all_headers[Headers.REPLY_TO_ADDRESS] = reply_to
        all_headers.pop(Headers.TIME_TO_BE_RECEIVED, None)  # the TTL argument decides
        if tracing_state.current is not None:
            # The current context (a send span: send(), send_many(), the outbox's collector)
            # travels with the message; send_many's others copy the first's headers.
            inject_trace_context(all_headers)
        validate_columns(all_headers)
        return self.outgoing(queue, message_id, all_headers, data, ttl=validate_ttl(ttl), columns_checked=True)

    def build_many(self, queue: str, bodies: Sequence[Any], *, message_id: str | None = None,
                   headers: Mapping[str, str] | None = None, correlation_id: str | None = None,
                   content_type: str | None = None, **options: Any) -> list[OutgoingMessage]:
        """:meth:`build` for several bodies with the same options, in order.  The options
        are validated once (the first message is built the long way); the others copy
        its headers with their own ids (:func:`core.outgoing.like_first`)."""
        bodies = list(bodies)
        same = dict(message_id=message_id, headers=headers, correlation_id=correlation_id,
                    content_type=content_type, **options)
        if not bodies:
            return []
        first = self.build(queue, bodies[0], **same)
        if message_id is not None:  # one id for all: rare enough for the long way
            return [first, *(self.build(queue, body, **same) for body in bodies[1:])]
        rest = like_first(first, bodies[1:], content_type=content_type,
                          max_body_bytes=get_settings().MAX_BODY_BYTES, options_headers=headers,
                          correlation_id=correlation_id)
        return [first, *(m if isinstance(m, OutgoingMessage) else self.build(queue, m, **same) for m in rest)]

    def outgoing(self, queue: str, message_id: str, headers: Mapping[str, str], body: bytes, *,
                 ttl: float | None = None, forever: bool = False,
                 columns_checked: bool = False) -> OutgoingMessage:
        """A row for ``queue`` from complete headers.  ``ttl`` (seconds; None: the one in
        the TimeToBeReceived header, if any) is capped by the queue's default TTL and
        written back to that header; ``forever`` drops both (error and dead-letter
        queues keep messages until someone acts).  ``columns_checked``: the CorrelationId
        and ReplyToAddress headers passed :func:`validate_columns`; otherwise a value their
        column would refuse stays in the headers only (:func:`column_value`).  UnknownQueue
        for a missing queue."""
        info = self._queue(queue)
        headers = dict(headers)
        if forever:
            ttl = None
        else:
            if ttl is None and Headers.TIME_TO_BE_RECEIVED in headers:
                try:
                    ttl = parse_timespan(headers[Headers.TIME_TO_BE_RECEIVED])
                except ValueError:
                    ttl = None  # unreadable: the queue's default decides
            ttl = info.effective_ttl(ttl)
        if ttl is None:
            headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
        else:
            headers[Headers.TIME_TO_BE_RECEIVED] = timespan(ttl)
        correlation_id, reply_to = headers.get(Headers.CORRELATION_ID), headers.get(Headers.REPLY_TO_ADDRESS)
        if not columns_checked:  # (a new message's were, by validate_columns: no second look on the send path)
            correlation_id, reply_to = column_value(correlation_id), column_value(reply_to)
        return OutgoingMessage(queue=info.name, row_id=row_id_for(message_id), headers=headers, body=body,
                               correlation_id=correlation_id, reply_to=reply_to, ttl_seconds=ttl)
