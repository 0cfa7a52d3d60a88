"""Handler registry and the context a handler gets.

    from core.handlers import handler

    @handler("orders", "PlaceOrder")
    def place_order(message, context):
        Order.objects.create(...)                      # same transaction as the receive
        context.send("billing", {"order": 1}, message_type="BillOrder")   # ditto

    @handler("orders", "OrderPlaced", batch=True)   # a list of messages of one type
    def orders_placed(messages, context):
        Order.objects.bulk_create([Order(ref=m.json()["ref"]) for m in messages])

A batch handler gets the messages of its type from one chunk of a receive batch (the
whole batch while nothing fails: core.receive.chunks.ChunkSize).  When it raises, the pump calls it again one message at a time
(one-element lists) to find the culprit: the others' work commits once, the culprit
takes the normal failure path.  In ``outbox`` and ``receive_only`` modes it is always
called with one message.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from typing import Any, Callable, Protocol, Sequence

from core.conf import get_settings
from core.messages import Headers, Message
from core.outgoing import valid_correlation_id

log = logging.getLogger("sluice.handlers")


class Handler(Protocol):
    def __call__(self, message: Message, context: "HandlerContext") -> Any: ...


class Sender(Protocol):
    """Where a handler's outgoing messages go: a Transport, or in outbox mode the outbox's
    collector (core.outbox.OutboxSender), which stores them for phase 2."""

    using: str

    def send(self, queue: str, body: Any, **options: Any) -> str: ...


class HandlerContext:
    """What a handler can do besides its own business writes.

    ``transport``: where outgoing messages go — in ``sends_atomic_with_receive`` mode it
    shares the receive's connection and transaction; in ``outbox`` mode it collects
    them.  One is made per handled message, so it is kept small (slots; ``extra`` made
    on first use)."""

    __slots__ = ("message", "transport", "_extra")

    def __init__(self, message: Message, transport: Sender, extra: dict[str, Any] | None = None) -> None:
        self.message = message
        self.transport = transport
        self._extra = extra

    @property
    def extra(self) -> dict[str, Any]:
        """Free space for middleware and handlers (made on first use)."""
        if self._extra is None:
            self._extra = {}
        return self._extra

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
        headers.setdefault(Headers.RELATED_TO, incoming.get(Headers.MESSAGE_ID, self.message.id))
        # The incoming correlation id travels on, as NServiceBus does: a search by it finds the
        # whole conversation.  One the database would refuse (a foreign producer's) is not
        # inherited: the send must not fail for a value the handler never chose.
        if "correlation_id" not in options and Headers.CORRELATION_ID not in headers:
            inherited = incoming.get(Headers.CORRELATION_ID) or self.message.correlation_id
            if inherited is not None and valid_correlation_id(inherited):
                options["correlation_id"] = inherited
        return self.transport.send(queue, body, headers=headers, **options)

    def reply(self, body: Any, **options: Any) -> str:
        """Send to the incoming message's reply-to address, correlated to it."""
        address = self.message.headers.get(Headers.REPLY_TO_ADDRESS) or self.message.reply_to
        if not address:
            raise ValueError("the incoming message has no reply-to address")
        options.setdefault("correlation_id", self.message.headers.get(Headers.CORRELATION_ID))
        headers = dict(options.pop("headers", None) or {})
        headers[Headers.MESSAGE_INTENT] = "Reply"
        return self.send(address.split("@")[0], body, headers=headers, **options)


class BatchContext:
    """What a batch handler gets beside its list of messages: the transaction's alias and
    transport, and per message a :class:`HandlerContext` (:meth:`for_message`) whose
    ``send`` / ``reply`` keep that message's conversation."""

    __slots__ = ("messages", "transport")

    def __init__(self, messages: Sequence[Message], transport: Sender) -> None:
        self.messages = messages
        self.transport = transport

    @property
    def using(self) -> str:
        """The database alias of the receive transaction (write business data here)."""
        return self.transport.using

    def for_message(self, message: Message) -> HandlerContext:
        return HandlerContext(message, self.transport)

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Send a message (no conversation headers: use :meth:`for_message` for those)."""
        return self.transport.send(queue, body, **options)


class BatchHandler(Protocol):
    def __call__(self, messages: list[Message], context: BatchContext) -> Any: ...


def as_single(fn: BatchHandler) -> Handler:
    """A batch handler as a one-message handler (modes that run messages one by one)."""

    def single(message: Message, context: HandlerContext) -> Any:
        return fn([message], BatchContext((message,), context.transport))

    return single


class FailureHook(Protocol):
    def __call__(self, message: Message, exc: BaseException, outcome: str, using: str) -> Any: ...


class RetryLimits(Protocol):
    def __call__(self, message: Message) -> tuple[int | None, int | None]: ...


class HandlerRegistry:
    """(queue, message type) → handler; a handler registered with no type takes the rest.

    A failure hook (:meth:`on_failure`) is told of each failed attempt of a message type
    after its handler's work was rolled back, in the receive's transaction, with where
    the message went (``retry``, ``delayed-retry``, ``error``): what a handler records
    inside its own work would roll back with it (core.tasks records task attempts so).

    Retry limits (:meth:`on_retry_limits`) let a message type's messages carry their own
    immediate and delayed retry counts (core.tasks: a task's ``@task(immediate_retries=…)``),
    in place of the pump's, read from the failed message when its outcome is decided."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str | None], Handler] = {}
        self._batch: set[tuple[str, str | None]] = set()
        self._failure_hooks: dict[tuple[str, str], FailureHook] = {}
        self._retry_limits: dict[tuple[str, str], RetryLimits] = {}
        self._lock = threading.Lock()

    def on_retry_limits(self, queue: str, message_type: str, fn: RetryLimits) -> RetryLimits:
        """Register ``fn(message) -> (immediate, delayed)``: a message's own retry counts
        (None for either keeps the pump's)."""
        with self._lock:
            self._retry_limits[(queue, message_type)] = fn
        return fn

    def retry_limits(self, queue: str, message: Message) -> tuple[int | None, int | None]:
        if self._retry_limits:
            for name in message.message_types():
                fn = self._retry_limits.get((queue, name))
                if fn is not None:
                    return fn(message)
        return None, None

    def on_failure(self, queue: str, message_type: str, fn: FailureHook) -> FailureHook:
        """Register ``fn(message, exc, outcome, using)`` for failed attempts of ``message_type`` on ``queue``."""
        with self._lock:
            self._failure_hooks[(queue, message_type)] = fn
        return fn

    def failure_hook(self, queue: str, message: Message) -> FailureHook | None:
        if not self._failure_hooks:
            return None
        for name in message.message_types():
            fn = self._failure_hooks.get((queue, name))
            if fn is not None:
                return fn
        return None

    def register(self, queue: str, message_type: str | None, fn: Handler | BatchHandler, *,
                 batch: bool = False) -> Handler | BatchHandler:
        """``batch``: ``fn(messages, context)`` takes a list (see the module doc)."""
        key = (queue, message_type)
        with self._lock:
            existing = self._handlers.get(key)
            if existing is not None and (existing is not fn or (key in self._batch) != batch):
                raise ValueError(f"queue {queue!r} already has a handler for {message_type or 'any type'}")
            self._handlers[key] = fn  # type: ignore[assignment]
            if batch:
                self._batch.add(key)
        return fn

    def unregister(self, queue: str, message_type: str | None) -> None:
        with self._lock:
            self._handlers.pop((queue, message_type), None)
            self._batch.discard((queue, message_type))
            if message_type is not None:
                self._failure_hooks.pop((queue, message_type), None)
                self._retry_limits.pop((queue, message_type), None)

    def lookup(self, queue: str, message: Message) -> tuple[Handler | BatchHandler | None, bool]:
        """The handler for ``message`` and whether it is a batch handler."""
        for name in message.message_types():
            for key in ((queue, name), (queue, name.rsplit(".", 1)[-1])):
                fn = self._handlers.get(key)
                if fn is not None:
                    return fn, key in self._batch
        key = (queue, None)
        fn = self._handlers.get(key)
        return fn, fn is not None and key in self._batch

    def resolve(self, queue: str, message: Message) -> Handler | BatchHandler | None:
        return self.lookup(queue, message)[0]

    def queues(self) -> list[str]:
        return sorted({queue for queue, _ in self._handlers})


handlers = HandlerRegistry()


def handler(queue: str, message_type: str | None = None, *, batch: bool = False) -> Callable[[Any], Any]:
    """Decorator: register ``fn(message, context)`` for a queue and message type; with
    ``batch=True``, ``fn(messages, context)`` for lists of messages (see the module doc)."""

    def register(fn: Any) -> Any:
        return handlers.register(queue, message_type, fn, batch=batch)

    return register


#: The module that serves the alerts queue (its ``register()`` adds the handler).
ALERTS_HANDLER_MODULE = "core.alerts.delivery"
#: The module that runs Django tasks (its ``register()`` adds a handler per queue of each
#: Sluice task backend in Django's TASKS setting).
TASKS_HANDLER_MODULE = "core.tasks.worker"


def load_handler_modules() -> None:
    """Import the modules named in SLUICE_HANDLER_MODULES so their handlers register; with
    SLUICE_ALERTS_ENABLED, also the alerts queue's (so `sluice setup` creates that queue and
    every worker delivers notifications); and the task handler for the queues of Sluice's
    task backend when Django's TASKS names it (core.tasks)."""
    for module in get_settings().HANDLER_MODULES:
        importlib.import_module(module)
    if get_settings().ALERTS_ENABLED:
        # By name, like the application's own handler modules: core.alerts builds on this
        # module (it registers a handler), so this module must not import it.
        importlib.import_module(ALERTS_HANDLER_MODULE).register()
    # The same for Django's Tasks framework: a project whose TASKS name Sluice's backend
    # gets the task handler on every worker, and `sluice setup` creates its queues.  Where
    # this Django has no Tasks framework (5.2 without the `tasks` extra) there is none to serve.
    if importlib.util.find_spec("django.tasks") is not None or importlib.util.find_spec("django_tasks") is not None:
        importlib.import_module(TASKS_HANDLER_MODULE).register()
