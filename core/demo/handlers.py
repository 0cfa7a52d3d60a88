"""Handlers of the demo queue.

- ``Ping``: writes one row to ``sluice_demo_ping`` (in the receive's transaction).  It
  is a batch handler: the Pings of one receive chunk are written in one INSERT, so a
  chunk's later messages do not wait for one ORM round trip per earlier message (the
  delayed benchmark measures lateness at this handler; see the README).  :func:`ping`
  is the same write for one message, for handlers that build on it.
- ``Fail``: always raises ValueError — watch it go through retries to the error queue.
- ``FailOnce``: fails on its first attempt, then succeeds (the count is in the row).
- ``Slow``: sleeps the seconds given in its JSON body (``{"seconds": 2}`` or ``2``).
- ``Relay``: writes a Ping row and sends one ``Relayed`` message onward to the queue in
  its body (``{"to": "queue"}`` or ``"queue@alias"``) — the outbox's showcase.
"""
from __future__ import annotations

import time

from core.demo.models import PingRecord
from core.handlers import BatchContext, HandlerContext, handler
from core.messages import Headers, Message

QUEUE = "demo"
MAX_SLOW_SECONDS = 60.0


def _ping_id(message: Message) -> str:
    return message.headers.get(Headers.MESSAGE_ID, message.id)


def ping(message: Message, context: HandlerContext) -> None:
    """One Ping row for one message (Relay and tests build on it)."""
    PingRecord.objects.using(context.using).create(message_id=_ping_id(message))


@handler(QUEUE, "Ping", batch=True)
def ping_batch(messages: list[Message], context: BatchContext) -> None:
    """The Pings of one chunk in one INSERT; a failure falls back to one at a time."""
    PingRecord.objects.using(context.using).bulk_create(
        [PingRecord(message_id=_ping_id(message)) for message in messages])


@handler(QUEUE, "Fail")
def fail(message: Message, context: HandlerContext) -> None:
    raise ValueError(f"Fail always fails (message {message.id})")


@handler(QUEUE, "FailOnce")
def fail_once(message: Message, context: HandlerContext) -> None:
    if context.attempt == 1:
        raise RuntimeError("FailOnce fails on its first attempt")


@handler(QUEUE, "Slow")
def slow(message: Message, context: HandlerContext) -> None:
    try:
        value = message.json()
    except ValueError:
        raise ValueError("Slow wants a JSON body: a number of seconds or {\"seconds\": N}") from None
    seconds = value.get("seconds", 1) if isinstance(value, dict) else value
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_SLOW_SECONDS:
        raise ValueError(f"Slow wants 0–{MAX_SLOW_SECONDS:g} seconds, not {seconds!r}")
    time.sleep(seconds)


@handler(QUEUE, "Relay")
def relay(message: Message, context: HandlerContext) -> None:
    try:
        to = message.json()["to"]
    except (ValueError, TypeError, KeyError):
        raise ValueError('Relay wants a JSON body {"to": "queue"}') from None
    ping(message, context)
    context.send(to, {"from": message.headers.get(Headers.MESSAGE_ID, message.id)}, message_type="Relayed")
