"""W3C trace context in message headers: ``traceparent``, ``tracestate`` and ``baggage``.

The fixed W3C propagators, not the process's global one (``OTEL_PROPAGATORS``): the
headers are a wire format other endpoints read, whatever this process is configured with.
Extraction always starts from an empty context, never the current one, so what a message
carries is all a consumer span hangs from.
"""
from __future__ import annotations

from typing import Iterable, Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.messages import Headers

PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
#: The headers the propagator owns.
FIELDS = frozenset(PROPAGATOR.fields)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``context`` (default: the current one) into ``headers``; a context without a
    span leaves them as they are."""
    PROPAGATOR.inject(headers, context)


def extract(headers: Mapping[str, str]) -> Context:
    """The context ``headers`` carry, on top of an empty one (never the current context)."""
    if Headers.TRACEPARENT not in headers and Headers.BAGGAGE not in headers:
        return Context()
    return PROPAGATOR.extract(headers, Context())


def span_context(headers: Mapping[str, str]) -> SpanContext | None:
    """The sender's span in ``headers``, or None when they carry no valid one."""
    found = trace.get_current_span(extract(headers)).get_span_context()
    return found if found.is_valid else None


def links(all_headers: Iterable[Mapping[str, str]]) -> list[Link]:
    """One link per distinct sender span in ``all_headers``."""
    seen: dict[tuple[int, int], Link] = {}
    for headers in all_headers:
        found = span_context(headers)
        if found is not None:
            seen.setdefault((found.trace_id, found.span_id), Link(found))
    return list(seen.values())
