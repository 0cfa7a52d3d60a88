"""Producer-side spans: ``send {queue}`` at send time, and the spans of the two places
that put stored messages into queues later — the delayed mover's forward and the
outbox's dispatch — which link to the sends whose context the messages carry.

Each function returns a context manager; off (``state.current`` None) it is one shared
``nullcontext`` that yields None: no span, no attributes, no links are made.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterable, Iterator, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode

from core.messages import Headers
from core.tracing import state
from core.tracing.propagation import links

SYSTEM = "sluice"
_NULL: ContextManager[None] = contextlib.nullcontext()


def error_type(exc: BaseException) -> str:
    """``error.type``: the exception's qualified class name."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def send_span(queue: str, *, delayed: bool = False) -> ContextManager[Span | None]:
    """``send {queue}`` (PRODUCER) in the caller's context; the messages built inside it
    carry its context in their headers (:func:`core.tracing.propagation.inject`, called by
    ``Transport.build``).  Report what was sent with :func:`sent`."""
    telemetry = state.current
    if telemetry is None:
        return _NULL
    return _span(telemetry, f"send {queue}", SpanKind.PRODUCER, None, [], {
        "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": queue, "sluice.delayed": delayed})


def sent(span: Span, messages: Sequence[Any]) -> None:
    """The messages (``OutgoingMessage``) the send span's call sent: ids and counts."""
    telemetry = state.current
    if telemetry is None:
        return
    if len(messages) == 1:
        span.set_attribute("messaging.message.id", messages[0].message_id)
        conversation = messages[0].headers.get(Headers.CONVERSATION_ID)
        if conversation:
            span.set_attribute("messaging.message.conversation_id", conversation)
    else:
        span.set_attribute("messaging.batch.message_count", len(messages))
    counts: dict[tuple[str, str], int] = {}
    for m in messages:
        key = (m.queue, m.headers.get(Headers.ENCLOSED_MESSAGE_TYPES) or "")
        counts[key] = counts.get(key, 0) + 1
    for (queue, message_type), count in counts.items():
        telemetry.instruments.sent.add(count, {"messaging.system": SYSTEM, "messaging.destination.name": queue,
                                               state.MESSAGE_TYPE: message_type})


def forward_span(store: str, headers: Iterable[Mapping[str, str]]) -> ContextManager[Span | None]:
    """The delayed mover's forward of due messages: a new trace (a mover's batch belongs to
    no one sender) linked to each message's sender."""
    telemetry = state.current
    if telemetry is None:
        return _NULL
    found = links(headers)
    return _span(telemetry, "forward delayed", SpanKind.PRODUCER, Context(), found, {
        "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "forward",
        "sluice.delayed.store": store, "messaging.batch.message_count": len(found)})


def dispatch_span(table: str, records: int, headers: Iterable[Mapping[str, str]]) -> ContextManager[Span | None]:
    """The outbox's phase 2 for some records: a new trace linked to the context each queue
    operation captured when its record was written."""
    telemetry = state.current
    if telemetry is None:
        return _NULL
    found = links(headers)
    return _span(telemetry, "dispatch outbox", SpanKind.PRODUCER, Context(), found, {
        "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "dispatch",
        "sluice.outbox.table": table, "sluice.outbox.records": records})


@contextlib.contextmanager
def _span(telemetry: state.Telemetry, name: str, kind: SpanKind, context: Context | None, found: list,
          attributes: dict[str, Any]) -> Iterator[Span]:
    """A current span (``context`` None: a child of the current one; an empty Context: a
    new trace) that records ``error.type`` when its block raises."""
    with telemetry.tracer.start_as_current_span(name, context=context, kind=kind, links=found,
                                                attributes=attributes, record_exception=False,
                                                set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("error.type", error_type(exc))
            span.set_status(StatusCode.ERROR, str(exc)[:200])
            raise
