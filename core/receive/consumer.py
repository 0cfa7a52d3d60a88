"""Receiving outside the pump (the CLI, scripts): one message, handled like the pump would
handle expired and poison rows, so a caller never gets either."""
from __future__ import annotations

from django.db import transaction

from core.expiry import on_expired_receive
from core.messages import Message
from core.receive.recoverability import Recoverability
from core.transport import Transport

#: Expired or poison rows skipped in one call before giving up (they are moved, not lost).
MAX_SKIPPED = 10_000


def receive_one(queue: str, using: str | None = None) -> Message | None:
    """Take the next live message off ``queue`` for good (committed), or None when empty."""
    transport = Transport(using)
    recoverability = Recoverability(transport)
    for _ in range(MAX_SKIPPED):
        with transaction.atomic(using=transport.using):
            message = transport.receive(queue)
            if message is None:
                return None
            if message.poison:
                recoverability.move_poison(message)
                continue
            if message.expired:
                on_expired_receive(transport, message)
                continue
            return message
    return None
