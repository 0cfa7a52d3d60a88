"""The message value type, the established header names, and header (de)serialisation.

Headers travel as a JSON object of string → string in the ``Headers`` column, with
the names NServiceBus endpoints use, so .NET and Python endpoints can share queues.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

from core.conf import get_settings
from core.errors import InvalidHeaders, PoisonMessage

NSB = "NServiceBus."


class Headers:
    """Header names (the ``NServiceBus.*`` ones are the wire format other endpoints read)."""

    MESSAGE_ID = NSB + "MessageId"
    CORRELATION_ID = NSB + "CorrelationId"
    CONVERSATION_ID = NSB + "ConversationId"
    REPLY_TO_ADDRESS = NSB + "ReplyToAddress"
    TIME_TO_BE_RECEIVED = NSB + "TimeToBeReceived"
    ENCLOSED_MESSAGE_TYPES = NSB + "EnclosedMessageTypes"
    CONTENT_TYPE = NSB + "ContentType"
    TIME_SENT = NSB + "TimeSent"
    DELIVER_AT = NSB + "DeliverAt"
    ORIGINATING_ENDPOINT = NSB + "OriginatingEndpoint"
    PROCESSING_ENDPOINT = NSB + "ProcessingEndpoint"
    ORIGINATING_MACHINE = NSB + "OriginatingMachine"
    RELATED_TO = NSB + "RelatedTo"
    MESSAGE_INTENT = NSB + "MessageIntent"
    #: W3C trace context (OpenTelemetry): carried as message headers across queues.
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"
    BAGGAGE = "baggage"
    # Failure headers (error queue).
    EXCEPTION_TYPE = NSB + "ExceptionInfo.ExceptionType"
    EXCEPTION_MESSAGE = NSB + "ExceptionInfo.Message"
    EXCEPTION_STACK_TRACE = NSB + "ExceptionInfo.StackTrace"
    EXCEPTION_SOURCE = NSB + "ExceptionInfo.Source"
    FAILED_Q = NSB + "FailedQ"
    TIME_OF_FAILURE = NSB + "TimeOfFailure"
    # Sluice's own.
    #: Failed attempts in the current round of immediate retries (reset by a delayed retry).
    FAILED_ATTEMPTS = "Sluice.FailedAttempts"
    #: Every failed attempt of the message, across rounds.
    TOTAL_FAILED_ATTEMPTS = "Sluice.TotalFailedAttempts"
    #: Delayed retries done so far, and when the last one was scheduled.
    DELAYED_RETRIES = NSB + "Retries"
    DELAYED_RETRIES_TIMESTAMP = NSB + "Retries.Timestamp"
    #: The destination of a delayed message that failed to forward (FailedQ is the store).
    DELAYED_DESTINATION = "Sluice.DelayedDestination"
    #: When the delayed-message mover put the message into its queue.
    DELIVERED_AT = "Sluice.DeliveredAt"
    RAW_HEADERS = "Sluice.RawHeaders"
    #: On an operator's retry of a failed message: the failure record it retries.
    RETRY_OF = "Sluice.RetryOf"
    EXPIRED_REASON = "Sluice.DeadLetterReason"
    #: On a message set aside because the database refused to record its outcome: which
    #: write was refused, and why (core.receive.last_resort).
    POISON_REASON = "Sluice.PoisonReason"


#: Headers only Sluice writes: retry counters, failure descriptions, where an operator's
#: retry goes.  A producer's send drops them (:func:`producer_headers`), so no sender can
#: skip retries, steer a retry into another queue or resolve someone else's failure.
CONTROL_HEADERS = frozenset({
    Headers.FAILED_ATTEMPTS, Headers.TOTAL_FAILED_ATTEMPTS, Headers.DELAYED_RETRIES,
    Headers.DELAYED_RETRIES_TIMESTAMP, Headers.DELAYED_DESTINATION, Headers.DELIVERED_AT, Headers.RAW_HEADERS,
    Headers.EXPIRED_REASON, Headers.FAILED_Q, Headers.TIME_OF_FAILURE, Headers.EXCEPTION_TYPE,
    Headers.EXCEPTION_MESSAGE, Headers.EXCEPTION_STACK_TRACE, Headers.EXCEPTION_SOURCE,
})
#: Every ``Sluice.*`` header is Sluice's own too (RetryOf, EditOf, … and any added later).
CONTROL_PREFIX = "Sluice."


def is_control_header(name: str) -> bool:
    return name in CONTROL_HEADERS or name.startswith(CONTROL_PREFIX)


def producer_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without the control headers a producer may not set."""
    return {k: v for k, v in headers.items() if not is_control_header(k)}


#: The largest count read from a header (retry counters): a column of 32-bit integers
#: holds it, whatever another system wrote.
MAX_COUNT = 2**31 - 2

#: The stack trace kept in an error-queue message, at most (its end).
MAX_STACK_TRACE = 16_000

WIRE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S:%f Z"


def wire_time(value: dt.datetime) -> str:
    """A UTC instant in the header format NServiceBus uses: ``2026-11-22 04:15:16:123456 Z``."""
    return value.astimezone(dt.timezone.utc).strftime(WIRE_TIME_FORMAT)


#: The form :data:`WIRE_TIME_FORMAT` writes, read by hand (strptime is ten times slower).
_WIRE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}):(\d{1,6}) Z")


def parse_wire_time(text: str) -> dt.datetime:
    found = _WIRE_TIME.fullmatch(text)
    if found is None:  # anything else as strptime reads it (or refuses it)
        return dt.datetime.strptime(text, WIRE_TIME_FORMAT).replace(tzinfo=dt.timezone.utc)
    *whole, fraction = found.groups()
    return dt.datetime(*map(int, whole), int(fraction.ljust(6, "0")), tzinfo=dt.timezone.utc)


def timespan(seconds: float) -> str:
    """A .NET TimeSpan string (``[d.]hh:mm:ss[.fffffff]``) for TimeToBeReceived."""
    ticks = int(round(seconds * 10_000_000))
    days, rem = divmod(ticks, 864_000_000_000)
    hours, rem = divmod(rem, 36_000_000_000)
    minutes, rem = divmod(rem, 600_000_000)
    secs, frac = divmod(rem, 10_000_000)
    text = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    if days:
        text = f"{days}.{text}"
    if frac:
        text += f".{frac:07d}"
    return text


TIMESPAN_RE = re.compile(r"^(?:(\d+)\.)?(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?$")


def parse_timespan(text: str) -> float:
    """Seconds in a .NET TimeSpan string (``[d.]hh:mm:ss[.fffffff]``); ValueError if malformed."""
    match = TIMESPAN_RE.match(text.strip())
    if not match:
        raise ValueError(f"not a TimeSpan: {text!r}")
    days, hours, minutes, seconds, fraction = match.groups()
    return (int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
            + (int(fraction.ljust(7, "0")) / 10_000_000 if fraction else 0.0))


def failure_headers(exc: BaseException, queue: str) -> dict[str, str]:
    """The error-queue headers that describe ``exc`` (NServiceBus names): what failed,
    where (``FailedQ``), when and on which endpoint."""
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    frames = traceback.extract_tb(exc.__traceback__)
    source = frames[-1].name if frames else ""
    module = type(exc).__module__
    exc_type = type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"
    return {
        Headers.EXCEPTION_TYPE: exc_type,
        Headers.EXCEPTION_MESSAGE: str(exc),
        Headers.EXCEPTION_STACK_TRACE: stack[-MAX_STACK_TRACE:],
        Headers.EXCEPTION_SOURCE: source,
        Headers.FAILED_Q: queue,
        Headers.TIME_OF_FAILURE: wire_time(dt.datetime.now(dt.timezone.utc)),
        Headers.PROCESSING_ENDPOINT: get_settings().ENDPOINT,
    }


def encode_headers(headers: Mapping[str, Any]) -> str:
    """Headers as the JSON text of a flat string → string object; InvalidHeaders otherwise."""
    if not isinstance(headers, Mapping):
        raise InvalidHeaders(f"headers must be a mapping of string to string, not {type(headers).__name__}")
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidHeaders(
                f"headers must map strings to strings: {key!r} → {value!r} ({type(value).__name__})"
            )
    text = json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":"))
    # isascii() is the hot path's whole cost (a C scan); only non-ASCII text is searched.
    if not text.isascii() and _SURROGATE.search(text):
        text = escape_surrogates(text)
    return text


#: A UTF-16 surrogate code point: Python strings may hold one alone (json.loads of
#: ``"\ud800"``, ``surrogateescape``), but no UTF-8 or UTF-16 encoder takes it, so a
#: driver refuses the whole statement.
_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """JSON text with each surrogate code point written as its ``\\uXXXX`` escape.  In JSON
    a surrogate can only stand inside a string, where the escape reads back as the same
    code point: any Python string round-trips (a high and a low surrogate held as two
    code points read back as the one character they encode, which is what UTF-16 means
    by them)."""
    return _SURROGATE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


#: What a plain text column cannot hold on some database: surrogates (no encoder takes
#: them) and NUL (PostgreSQL's text refuses it).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(value: str) -> str:
    """``value`` with what a text column cannot hold replaced by U+FFFD: for columns that
    describe a message (a failed-message record's exception text, a processing record's
    copied headers), never for its headers, which keep every value exactly."""
    return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value


_ONLY_TEXT = frozenset({str})
#: json's scanner (C where this Python has it), without ``json.loads``'s wrapping: that
#: wrapping (a decoder call and two whitespace matches) is half of reading a header
#: object, and more than half of reading a small body.
_scan_json = json.JSONDecoder().scan_once


def _read_json(text: str) -> Any:
    """``json.loads(text)``: the same value, and the same errors where ``text`` is not
    exactly one JSON value with nothing around it (the common case, read in one call).
    One edge apart: on Python 3.11, where json's C scanner counts its nesting against the
    recursion limit, a value nested to within two levels of that limit is read here, where
    ``json.loads`` (two frames deeper) raises RecursionError."""
    if type(text) is str:
        try:
            value, end = _scan_json(text, 0)
        except (StopIteration, ValueError):
            end = -1  # json.loads says what is wrong, in its own words
        if end == len(text):
            return value
    return json.loads(text)


def decode_headers(text: str) -> dict[str, str]:
    """The header object of a queue row; PoisonMessage if it is not a flat string map."""
    try:
        value = _read_json(text)
    except (TypeError, ValueError) as exc:
        raise PoisonMessage(f"Headers column is not valid JSON: {exc}") from None
    except RecursionError:
        # Nesting deeper than the parser goes: no header map is ever that deep.
        raise PoisonMessage("Headers column nests JSON too deeply to read") from None
    if not isinstance(value, dict):
        raise PoisonMessage(f"Headers column is JSON {type(value).__name__}, not an object")
    # The types of the values, in C (this runs for every message received); JSON's
    # strings are exact str, so a set of only str is the common case.
    if not set(map(type, value.values())) <= _ONLY_TEXT:
        bad = [k for k, v in value.items() if not isinstance(v, str)]
        raise PoisonMessage(f"Headers column has non-string values for {', '.join(bad[:5])}")
    return value


@dataclass
class Message:
    """A message taken from (or looked at in) a queue table."""

    id: str
    headers: dict[str, str]
    body: bytes
    queue: str
    row_version: int = 0
    expires: dt.datetime | None = None
    expired: bool = False
    correlation_id: str | None = None
    reply_to: str | None = None
    raw_headers: str = field(default="", repr=False)
    #: Why the row is poison (its headers cannot be parsed), or None.
    poison: str | None = None

    @property
    def message_type(self) -> str | None:
        return self.headers.get(Headers.ENCLOSED_MESSAGE_TYPES)

    @property
    def failed_attempts(self) -> int:
        try:
            return min(int(self.headers.get(Headers.FAILED_ATTEMPTS, "0")), MAX_COUNT)
        except ValueError:
            return 0

    @property
    def total_failed_attempts(self) -> int:
        total = self.headers.get(Headers.TOTAL_FAILED_ATTEMPTS)
        if total is None:
            return self.failed_attempts
        try:
            return min(int(total), MAX_COUNT)
        except ValueError:
            return self.failed_attempts

    @property
    def delayed_retries(self) -> int:
        try:
            return min(int(self.headers.get(Headers.DELAYED_RETRIES, "0")), MAX_COUNT)
        except ValueError:
            return 0

    @property
    def text(self) -> str | None:
        """The body as text when it is UTF-8, else None."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not)."""
        body = self.body
        # json.loads(bytes) first guesses UTF-8, -16 or -32 from the opening bytes; a body
        # whose first two bytes are ASCII other than NUL (no BOM, no UTF-16/32 zero byte)
        # is UTF-8 by that guess, decoded here as json.loads would, without the guess.
        if body[:2].isascii() and b"\x00" not in body[:2]:
            return _read_json(body.decode("utf-8", "surrogatepass"))
        return json.loads(body)

    def message_types(self) -> list[str]:
        """The enclosed types, most specific first, without .NET assembly suffixes."""
        return list(enclosed_types(self.message_type or ""))


@functools.lru_cache(maxsize=1024)
def enclosed_types(raw: str) -> tuple[str, ...]:
    """The types of an ``NServiceBus.EnclosedMessageTypes`` value (see
    :meth:`Message.message_types`).  Cached: a queue carries a few types, and this is
    read for every message handled (its handler, its processing record)."""
    return tuple(part.split(",")[0].strip() for part in raw.split(";") if part.strip())
