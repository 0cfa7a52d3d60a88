"""Outgoing operations of the outbox: what a handler or session sends, as stored data.

An outbox record keeps its outgoing messages as JSON text, versioned so a newer
Sluice can still read what an older one stored::

    {"v": 1, "ops": [
      {"kind": "queue", "queue": "billing", "using": null, "message_id": "…",
       "headers": {…}, "body": "<base64>", "correlation_id": "…", "reply_to": null,
       "ttl": 300.0, "deliver_at": null},
      {"kind": "celery", "task": "app.tasks.email", "args": [], "kwargs": {}, "options": {},
       "task_id": "…"}
    ]}

A ``queue`` operation is a message validated and built at send time (so bad input
fails inside the business transaction, which then rolls back), dispatched later exactly
as built: a re-dispatch after a crash carries the same message id, which is what lets
the receiver's outbox recognise the duplicate.  Other kinds are *destinations*
registered by other packages (``workers.outbox`` registers ``celery``): core never
imports them, it imports the modules named in ``SLUICE_OUTBOX_DESTINATION_MODULES``
when it first meets a kind it does not know.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import importlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from django.db import connections

from core.conf import get_settings
from core.errors import InvalidMessage, SluiceError
from core.transport import OutgoingMessage, Transport, row_id_for

log = logging.getLogger("sluice.outbox")

FORMAT_VERSION = 1
QUEUE = "queue"
EMPTY_OPERATIONS = json.dumps({"v": FORMAT_VERSION, "ops": []}, separators=(",", ":"))


class UnknownDestination(SluiceError, LookupError):
    """An outgoing message names a database alias or destination kind nobody knows."""


class UnreadableOperations(SluiceError):
    """An outbox record whose operations cannot be parsed; it is quarantined, not dropped."""


# -- destinations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """How operations of one kind are checked at send time and carried out at dispatch."""

    kind: str
    dispatch: Callable[[dict[str, Any]], None]
    validate: Callable[[dict[str, Any]], None] | None = None


_destinations: dict[str, Destination] = {}
_destinations_lock = threading.Lock()
_modules_loaded = False


def register_destination(kind: str, dispatch: Callable[[dict[str, Any]], None],
                         validate: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Let outbox operations of ``kind`` be sent: ``validate(op)`` runs at send time
    (raise to refuse), ``dispatch(op)`` in phase 2 (raise to leave the record undispatched)."""
    if kind == QUEUE or not isinstance(kind, str) or not kind:
        raise ValueError(f"destination kind must be a non-empty string other than {QUEUE!r}")
    with _destinations_lock:
        _destinations[kind] = Destination(kind, dispatch, validate)


def destination(kind: str) -> Destination:
    """The registered destination for ``kind``, importing the destination modules once."""
    global _modules_loaded
    found = _destinations.get(kind)
    if found is None and not _modules_loaded:
        for module in get_settings().OUTBOX_DESTINATION_MODULES:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                log.warning("outbox destination module %s cannot be imported: %s", module, exc)
        _modules_loaded = True
        found = _destinations.get(kind)
    if found is None:
        raise UnknownDestination(
            f"no outbox destination of kind {kind!r} is registered "
            f"(SLUICE_OUTBOX_DESTINATION_MODULES: {', '.join(get_settings().OUTBOX_DESTINATION_MODULES) or 'none'})"
        )
    return found


# -- addresses and delays ------------------------------------------------------------------


def parse_address(address: str) -> tuple[str, str | None]:
    """``queue`` or ``queue@alias`` (alias: a Django database alias) → (queue, alias or None).

    Queue names cannot contain ``@``, so the split is unambiguous."""
    if not isinstance(address, str):
        raise InvalidMessage(f"destination must be a queue name, not {address!r}")
    queue, sep, alias = address.partition("@")
    if not sep:
        return queue, None
    if not alias or "@" in alias:
        raise UnknownDestination(f"destination {address!r} should be 'queue' or 'queue@database-alias'")
    if alias not in connections.settings:
        raise UnknownDestination(
            f"destination {address!r} names database alias {alias!r}, which is not in DATABASES "
            f"(known: {', '.join(sorted(connections.settings))})"
        )
    return queue, alias


def resolve_deliver_at(delay: Any = None, deliver_at: Any = None,
                       now: dt.datetime | None = None) -> dt.datetime | None:
    """The absolute UTC due time of a delayed message, computed at send time (None: send
    at once).  Validation is core.delayed's.

    Stored as an instant (not a delay) so a late dispatch — after a crash, say — does
    not push the message further back."""
    from core.delayed import resolve_due  # delayed builds on transport, as this module does

    wait, when = resolve_due(delay, deliver_at)
    if wait is not None:
        return (now or dt.datetime.now(dt.timezone.utc)) + dt.timedelta(seconds=wait)
    return when


# -- the format ----------------------------------------------------------------------------


def queue_operation(message: OutgoingMessage, using: str | None, deliver_at: dt.datetime | None) -> dict[str, Any]:
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
        "deliver_at": deliver_at.isoformat() if deliver_at else None,
    }


def outgoing_message(op: dict[str, Any]) -> OutgoingMessage:
    """The message a ``queue`` operation describes, exactly as it was built at send time."""
    return OutgoingMessage(queue=op["queue"], row_id=row_id_for(op["message_id"]), headers=dict(op["headers"]),
                           body=base64.b64decode(op["body"], validate=True), correlation_id=op.get("correlation_id"),
                           reply_to=op.get("reply_to"), ttl_seconds=op.get("ttl"))


def serialize_operation(op: dict[str, Any]) -> str:
    """The JSON of one operation; InvalidMessage (at send time) when it has none."""
    try:
        return json.dumps(op, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"outbox operation for {op.get('kind')!r} cannot be serialized to JSON: {exc}"
        ) from None


def encode_operations(serialized: list[str]) -> str:
    """The Operations text of a record from already serialized operations."""
    return f'{{"v":{FORMAT_VERSION},"ops":[{",".join(serialized)}]}}'


def decode_operations(text: str) -> list[dict[str, Any]]:
    """The operations of a record; UnreadableOperations says what is wrong with them."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise UnreadableOperations(f"Operations is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or value.get("v") != FORMAT_VERSION or not isinstance(value.get("ops"), list):
        raise UnreadableOperations(
            f'Operations is not {{"v": {FORMAT_VERSION}, "ops": [...]}} (this Sluice reads format {FORMAT_VERSION})')
    ops = value["ops"]
    for index, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("kind"), str):
            raise UnreadableOperations(f"operation {index} has no kind")
        if op["kind"] == QUEUE:
            try:
                if not isinstance(op["queue"], str) or not isinstance(op["message_id"], str):
                    raise TypeError("queue and message_id must be strings")
                if not isinstance(op["headers"], dict) or not all(
                        isinstance(k, str) and isinstance(v, str) for k, v in op["headers"].items()):
                    raise TypeError("headers must map strings to strings")
                base64.b64decode(op["body"], validate=True)
                if op.get("deliver_at") is not None:
                    dt.datetime.fromisoformat(op["deliver_at"])
            except (KeyError, TypeError, ValueError, binascii.Error) as exc:
                raise UnreadableOperations(f"operation {index} (queue) is malformed: {exc}") from None
    return ops


def describe(op: dict[str, Any]) -> str:
    """A short human-readable destination: ``billing``, ``billing@other``, ``celery:app.tasks.x``."""
    if op.get("kind") == QUEUE:
        return op["queue"] + (f"@{op['using']}" if op.get("using") else "")
    return f"{op.get('kind')}:{op.get('task') or op.get('name') or '?'}"


# -- collecting ----------------------------------------------------------------------------


class OutboxSender:
    """Collects outgoing operations instead of sending them.

    It stands in for the :class:`~core.transport.Transport` of a handler's context (same
    ``send`` signature, same ``using``) and is what a transactional session sends with.
    Every operation is validated and serialized when it is added, so bad input raises in
    the caller's transaction and rolls its business writes back with it.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self.operations: list[dict[str, Any]] = []
        self._serialized: list[str] = []

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Like :meth:`Transport.send`, plus ``queue@alias`` (another configured database)
        and ``delay`` (seconds) / ``deliver_at`` (aware datetime) for delayed delivery.
        Returns the message id."""
        name, alias = parse_address(queue)
        deliver_at = resolve_deliver_at(options.pop("delay", None), options.pop("deliver_at", None))
        message = Transport(alias or self.using).build(name, body, **options)  # unknown queue, bad headers, …
        self._append(queue_operation(message, alias if alias != self.using else None, deliver_at))
        return message.message_id

    def add(self, kind: str, op: dict[str, Any]) -> None:
        """Add an operation for a registered destination kind (e.g. ``celery``)."""
        found = destination(kind)
        op = {**op, "kind": kind}
        if found.validate is not None:
            found.validate(op)
        self._append(op)

    def _append(self, op: dict[str, Any]) -> None:
        self._serialized.append(serialize_operation(op))
        self.operations.append(op)

    def encode(self) -> str:
        return encode_operations(self._serialized)
