"""W3C trace context in message headers: ``traceparent``, ``tracestate`` and ``baggage``.

The fixed W3C propagators, not the process's global one (``OTEL_PROPAGATORS``): the
headers are a wire format other endpoints read, whatever this process is configured with.
Extraction always starts from an empty context, never the current one, so what a message
carries is all a consumer span hangs from.
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from core.messages import Headers

PROPAGATOR = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
#: The headers the propagator owns.
FIELDS = frozenset(PROPAGATOR.fields)


def inject(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``context`` (default: the current one) into ``headers``; a context without a
    span leaves them as they are."""
    PROPAGATOR.inject(headers, context)


#: The one ``traceparent`` form Sluice itself writes (version 00, lower-case hex).
_PLAIN_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def extract(headers: Mapping[str, str]) -> Context:
    """The context ``headers`` carry, on top of an empty one (never the current context)."""
    if Headers.TRACEPARENT not in headers and Headers.BAGGAGE not in headers:
        return Context()
    if Headers.BAGGAGE not in headers and Headers.TRACESTATE not in headers:
        plain = plain_span_context(headers[Headers.TRACEPARENT])
        if plain is not None:
            return trace.set_span_in_context(NonRecordingSpan(plain), Context())
    return PROPAGATOR.extract(headers, Context())


def plain_span_context(traceparent: str) -> SpanContext | None:
    """A plain version-00 ``traceparent`` read without the propagator, which costs several
    times as much and runs once per message; None for anything else (the propagator then
    reads it, so both give the same answer: tests/test_tracing_fast_paths.py)."""
    parts = plain_traceparent_parts(traceparent)
    if parts is None:
        return None
    trace_id, span_id, flags = parts
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(flags))


def plain_traceparent_parts(traceparent: str) -> tuple[str, str, int] | None:
    """The trace id and span id (hex, as written) and the flags of a plain version-00
    ``traceparent``; None for anything else.  The ids stay text: an unsampled message's
    span needs its trace id only if its handler sends (core.tracing.consuming)."""
    match = _PLAIN_TRACEPARENT.fullmatch(traceparent)
    if match is None:
        return None
    trace_id, span_id, flags = match.groups()
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, int(flags, 16)


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
