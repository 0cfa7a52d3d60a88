"""Handler registry and the context a handler gets.

    from core.handlers import handler

    @handler("orders", "PlaceOrder")
    def place_order(message, context):
        Order.objects.create(...)                      # same transaction as the receive
        context.send("billing", {"order": 1}, message_type="BillOrder")   # ditto
"""
from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from core.conf import get_settings
from core.messages import Headers, Message

log = logging.getLogger("sluice.handlers")


class Handler(Protocol):
    def __call__(self, message: Message, context: "HandlerContext") -> Any: ...


class Sender(Protocol):
    """Where a handler's outgoing messages go: a Transport, or in outbox mode the outbox's
    collector (core.outbox.OutboxSender), which stores them for phase 2."""

    using: str

    def send(self, queue: str, body: Any, **options: Any) -> str: ...


@dataclass
class HandlerContext:
    """What a handler can do besides its own business writes."""

    message: Message
    #: Transport for outgoing messages: in ``sends_atomic_with_receive`` mode it shares
    #: the receive's connection and transaction; in ``outbox`` mode it collects them.
    transport: Sender
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def attempt(self) -> int:
        """1 on the first attempt, 2 on the first retry, … counted across delayed retries."""
        return self.message.total_failed_attempts + 1

    @property
    def using(self) -> str:
        """The database alias of the receive transaction (write business data here)."""
        return self.transport.using

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Send a message that belongs to this conversation."""
        headers = dict(options.pop("headers", None) or {})
        incoming = self.message.headers
        if Headers.CONVERSATION_ID in incoming:
            headers.setdefault(Headers.CONVERSATION_ID, incoming[Headers.CONVERSATION_ID])
        headers.setdefault("NServiceBus.RelatedTo", incoming.get(Headers.MESSAGE_ID, self.message.id))
        return self.transport.send(queue, body, headers=headers, **options)

    def reply(self, body: Any, **options: Any) -> str:
        """Send to the incoming message's reply-to address, correlated to it."""
        address = self.message.headers.get(Headers.REPLY_TO_ADDRESS) or self.message.reply_to
        if not address:
            raise ValueError("the incoming message has no reply-to address")
        options.setdefault("correlation_id", self.message.headers.get(Headers.CORRELATION_ID))
        return self.send(address.split("@")[0], body, **options)


class HandlerRegistry:
    """(queue, message type) → handler; a handler registered with no type takes the rest."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str | None], Handler] = {}
        self._lock = threading.Lock()

    def register(self, queue: str, message_type: str | None, fn: Handler) -> Handler:
        with self._lock:
            existing = self._handlers.get((queue, message_type))
            if existing is not None and existing is not fn:
                raise ValueError(f"queue {queue!r} already has a handler for {message_type or 'any type'}")
            self._handlers[(queue, message_type)] = fn
        return fn

    def unregister(self, queue: str, message_type: str | None) -> None:
        with self._lock:
            self._handlers.pop((queue, message_type), None)

    def resolve(self, queue: str, message: Message) -> Handler | None:
        for name in message.message_types():
            fn = self._handlers.get((queue, name)) or self._handlers.get((queue, name.rsplit(".", 1)[-1]))
            if fn is not None:
                return fn
        return self._handlers.get((queue, None))

    def queues(self) -> list[str]:
        return sorted({queue for queue, _ in self._handlers})


handlers = HandlerRegistry()


def handler(queue: str, message_type: str | None = None) -> Callable[[Handler], Handler]:
    """Decorator: register ``fn(message, context)`` for a queue and message type."""

    def register(fn: Handler) -> Handler:
        return handlers.register(queue, message_type, fn)

    return register


def load_handler_modules() -> None:
    """Import the modules named in SLUICE_HANDLER_MODULES so their handlers register."""
    for module in get_settings().HANDLER_MODULES:
        importlib.import_module(module)
