"""The stored format of outgoing operations: what a handler or session sends, as JSON.

An outbox record keeps its outgoing messages as JSON text, versioned so a newer
Sluice can still read what an older one stored::

    {"v": 1, "ops": [
      {"kind": "queue", "queue": "billing", "using": null, "message_id": "…",
       "headers": {…}, "body": "<base64>", "correlation_id": "…", "reply_to": null,
       "ttl": 300.0, "delay": 60.0, "deliver_at": null},
      {"kind": "celery", "task": "app.tasks.email", "args": [], "kwargs": {}, "options": {},
       "task_id": "…"}
    ]}

A ``queue`` operation is a message validated and built at send time (so bad input
fails inside the business transaction, which then rolls back), dispatched later exactly
as built: a re-dispatch after a crash carries the same message id, which is what lets
the receiver's outbox recognise the duplicate.  ``delay`` is counted from the record's
CreatedAt, by the database's clock (``deliver_at``, an absolute instant the caller
gave, is kept as given; records stored before ``delay`` existed have it too).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
from typing import Any

from core.errors import InvalidMessage, SluiceError
from core.messages import escape_surrogates
from core.transport import OutgoingMessage

FORMAT_VERSION = 1
QUEUE = "queue"
EMPTY_OPERATIONS = json.dumps({"v": FORMAT_VERSION, "ops": []}, separators=(",", ":"))


class UnreadableOperations(SluiceError):
    """An outbox record whose operations cannot be parsed; it is quarantined, not dropped."""


def queue_operation(message: OutgoingMessage, using: str | None, delay: float | None,
                    deliver_at: dt.datetime | None) -> dict[str, Any]:
    return {
        "kind": QUEUE,
        "queue": message.queue,
        "using": using,
        "message_id": message.message_id,
        "headers": message.headers,
        "body": base64.b64encode(message.body).decode("ascii"),
        "correlation_id": message.correlation_id,
        "reply_to": message.reply_to,
        "ttl": message.ttl_seconds,
        "delay": delay,
        "deliver_at": deliver_at.isoformat() if deliver_at else None,
    }


def is_delayed(op: dict[str, Any]) -> bool:
    return bool(op.get("delay") or op.get("deliver_at"))


def serialize_operation(op: dict[str, Any]) -> str:
    """The JSON of one operation; InvalidMessage (at send time) when it has none.

    Lone surrogates are escaped as the queue's header text escapes them: a handler's send
    may carry on a value read from another system's row (its ConversationId), and the
    driver would refuse the record's whole insert, failing a handler that succeeded."""
    try:
        text = json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"outbox operation for {op.get('kind')!r} cannot be serialized to JSON: {exc}"
        ) from None
    return text if text.isascii() else escape_surrogates(text)


def encode_operations(serialized: list[str]) -> str:
    """The Operations text of a record from already serialized operations."""
    return f'{{"v":{FORMAT_VERSION},"ops":[{",".join(serialized)}]}}'


def decode_operations(text: str) -> list[dict[str, Any]]:
    """The operations of a record; UnreadableOperations says what is wrong with them."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise UnreadableOperations(f"Operations is not valid JSON: {exc}") from None
    except RecursionError:
        raise UnreadableOperations("Operations nests JSON too deeply to read") from None
    if not isinstance(value, dict) or value.get("v") != FORMAT_VERSION or not isinstance(value.get("ops"), list):
        raise UnreadableOperations(
            f'Operations is not {{"v": {FORMAT_VERSION}, "ops": [...]}} (this Sluice reads format {FORMAT_VERSION})')
    ops = value["ops"]
    for index, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("kind"), str):
            raise UnreadableOperations(f"operation {index} has no kind")
        if op["kind"] == QUEUE:
            try:
                _check_queue_operation(op)
            except (KeyError, TypeError, ValueError, binascii.Error) as exc:
                raise UnreadableOperations(f"operation {index} (queue) is malformed: {exc}") from None
    return ops


def _check_queue_operation(op: dict[str, Any]) -> None:
    if not isinstance(op["queue"], str) or not isinstance(op["message_id"], str):
        raise TypeError("queue and message_id must be strings")
    if not isinstance(op["headers"], dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in op["headers"].items()):
        raise TypeError("headers must map strings to strings")
    base64.b64decode(op["body"], validate=True)
    delay = op.get("delay")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                              or not math.isfinite(delay) or delay < 0):
        raise ValueError(f"delay must be a number of seconds, not {delay!r}")
    if op.get("deliver_at") is not None:
        dt.datetime.fromisoformat(op["deliver_at"])


def describe(op: dict[str, Any]) -> str:
    """A short human-readable destination: ``billing``, ``billing@other``, ``celery:app.tasks.x``."""
    if op.get("kind") == QUEUE:
        return op["queue"] + (f"@{op['using']}" if op.get("using") else "")
    return f"{op.get('kind')}:{op.get('task') or op.get('name') or '?'}"
