"""The last resort: a message whose outcome the database refuses to record.

Recording what happened to a message — its immediate or delayed retry, its move to the
error or dead-letter queue — is a write, and the database can refuse it for what the
message holds (a trigger, a constraint, a value no check foresaw).  Left to roll the
receive back, such a refusal comes back with the message at every receive: the queue
stalls, the handlers of the messages around it run again and again.  So the refusal is
the message's own poison (issue 34):

1. each recording runs in a savepoint (:func:`guarded`: failure paths only, a handled
   message never comes here, so the hot path pays nothing);
2. refused, the message goes to the error queue *as it was received*: its Headers column's
   text and its body unchanged, plus ``Sluice.PoisonReason`` naming the refused write and
   the database's error;
3. that refused too (a trigger or a broken table on the error queue), the row is parked
   in the queue ``<error queue>.parked`` (an error queue of its own, created when first
   needed, never received from or ingested: an operator looks at it, an alert rule on its
   length fires), with one ERROR in the log.

Either way the rest of the batch commits and the queue moves on: never a loop.  What the
database does not refuse for the message's sake — a deadlock, a lost connection, a
transaction it rolled back — is not the message's poison: it fails the batch as before,
to be received again.
"""
from __future__ import annotations

import json
import logging
from typing import Callable, TypeVar

from django.db import connections, transaction

from core.errors import Unavailable
from core.messages import Headers, Message, encode_headers
from core.models import QueueKind
from core.outgoing import OutgoingMessage
from core.queues import create_queue
from core.transport import Transport

log = logging.getLogger("sluice.recoverability")

#: Where a message is parked when even its raw move to the error queue is refused.
PARKED_SUFFIX = ".parked"
#: The longest PoisonReason kept (the database's error text can be long).
MAX_REASON = 2000

T = TypeVar("T")


def guarded(transport: Transport, error_queue: str, message: Message, write: str,
            record: Callable[[], T]) -> T | None:
    """``record()`` in a savepoint on the transport's connection; its value, or None when the
    database refused it for this message, which was then set aside (:func:`set_aside`).
    ``write`` names the write in the log and in ``Sluice.PoisonReason``."""
    try:
        with transaction.atomic(using=transport.using):
            return record()
    except Exception as exc:
        if not refused_for_the_message(transport, exc):
            raise
        set_aside(transport, error_queue, message, write, exc)
        return None


def refused_for_the_message(transport: Transport, exc: BaseException) -> bool:
    """False for what is the database's state, not the message's content: a transient error
    (deadlock, lock timeout, lost connection), a savepoint that could not be rolled back, or
    a part of Sluice pausing after such an error (the delayed store's breaker: ``Unavailable``)."""
    if isinstance(exc, Unavailable):
        return False
    return not (connections[transport.using].needs_rollback or transport.dialect.is_transient(exc))


def set_aside(transport: Transport, error_queue: str, message: Message, write: str, exc: BaseException) -> None:
    """The message as it was received into the error queue, with ``Sluice.PoisonReason``;
    refused too, parked (module doc).  One ERROR either way."""
    reason = f"the database refused {write}: {type(exc).__name__}: {exc}"[:MAX_REASON]
    row = raw_row(message, error_queue, reason)
    try:
        with transaction.atomic(using=transport.using):
            transport.enqueue([row])
    except Exception as again:
        if not refused_for_the_message(transport, again):
            raise
        parked = error_queue + PARKED_SUFFIX
        create_queue(parked, kind=QueueKind.ERROR, using=transport.using)  # idempotent
        moved = f"the raw move to {error_queue}: {type(again).__name__}: {again}"
        row = raw_row(message, parked, f"{reason}; then {moved}"[:MAX_REASON])
        transport.enqueue([row])  # refused here, the database refuses everything: the batch fails
        log.error("message %s on %s: the database refused %s (%s: %s) and %s; parked in %s", message.id,
                  message.queue, write, type(exc).__name__, exc, moved, parked)
        return
    log.error("message %s on %s: the database refused %s (%s: %s); moved as received to %s with %s",
              message.id, message.queue, write, type(exc).__name__, exc, error_queue, Headers.POISON_REASON)


def raw_row(message: Message, queue: str, reason: str) -> OutgoingMessage:
    """The received row for ``queue``: its header text and body as they were, the reason
    added.  The text goes back as the database gave it (whatever it holds, the column
    took it), with one key spliced in: written as ASCII JSON, which every driver sends.
    Header text that is no JSON object (a poison row) is kept whole in ``Sluice.RawHeaders``."""
    text = message.raw_headers.strip()
    pair = f"{json.dumps(Headers.POISON_REASON)}:{json.dumps(reason)}"
    if text.startswith("{") and text.endswith("}") and not message.poison:
        inside = text[1:-1].strip()
        # Last, so that it wins over a PoisonReason another system wrote (JSON readers keep
        # the last of a repeated key).
        headers_json = "{" + (f"{inside},{pair}" if inside else pair) + "}"
    else:
        headers_json = encode_headers({Headers.MESSAGE_ID: message.id, Headers.RAW_HEADERS: message.raw_headers,
                                       Headers.POISON_REASON: reason})
    return OutgoingMessage(queue=queue, row_id=message.id, headers={Headers.MESSAGE_ID: message.id},
                           body=message.body, correlation_id=message.correlation_id, reply_to=message.reply_to,
                           ttl_seconds=None, expires=None, headers_json=headers_json)
