"""Message expiry (TTL): what happens to a message that expired before it was handled.

The database decides whether a row is expired (its own clock, in the receive
statement).  An expired message never reaches a handler: it is dropped, or moved to
the queue's dead-letter queue with a reason header when the queue asks for that.
"""
from __future__ import annotations

import logging

from core.messages import Headers, Message
from core.queues import registry
from core.transport import Transport

log = logging.getLogger("sluice.expiry")

EXPIRED_REASON = "TTLExpiredException"


def on_expired_receive(transport: Transport, message: Message) -> str:
    """Drop or dead-letter an expired message taken by a receive; returns what it did."""
    info = registry.get(message.queue, transport.using)
    if info.dead_letter_on_expiry and info.dead_letter_queue:
        headers = {**message.headers, Headers.EXPIRED_REASON: EXPIRED_REASON,
                   Headers.FAILED_Q: message.queue}
        headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
        transport.requeue(info.dead_letter_queue, message, headers=headers, expires=False)
        log.info("expired message %s on %s dead-lettered to %s", message.id, message.queue, info.dead_letter_queue)
        return "dead-lettered"
    log.info("expired message %s on %s dropped (expired %s)", message.id, message.queue, message.expires)
    return "dropped"
