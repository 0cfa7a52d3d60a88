"""Where a message's process span starts: its parent context and links (a first delivery
under its sender's span; a delayed send or any retry a new trace linked to it), and the
span of a message whose sender was not sampled."""
from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, NonRecordingSpan, Span, SpanContext, TraceFlags

from core.messages import Headers
from core.tracing.propagation import extract


def starts_new_trace(headers: dict[str, str]) -> bool:
    """A delivery that is not its sender's direct consequence: a delayed send, a delayed
    retry or an operator's retry."""
    return (Headers.DELIVER_AT in headers or Headers.RETRY_OF in headers
            or headers.get(Headers.DELAYED_RETRIES, "0") not in ("", "0"))


def parent_of(headers: dict[str, str]) -> tuple[Context, list[Link]]:
    """The context a message's process span starts from, and its links."""
    carried = extract(headers)
    if not starts_new_trace(headers):
        return carried, []
    sender = trace.get_current_span(carried).get_span_context()
    # The carried baggage stays; the span is dropped, so the new span roots a new trace.
    return trace.set_span_in_context(INVALID_SPAN, carried), ([Link(sender)] if sender.is_valid else [])


def trace_id_of_span(span: Span) -> str | None:
    """A span's trace id as the processing records keep it (32 lower-case hex digits), or
    None for an invalid span (a no-op tracer's)."""
    context = span.get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class Unsampled(NonRecordingSpan):
    """The span of a message whose sender was not sampled, as the SDK's parent-based
    sampler makes it — non-recording, a span id of its own, the parent's flags passed on
    to what the handler sends (the SDK keeps only the "random trace id" bit) — with its
    context made only when something asks for it: a send from the handler, an
    instrumented library.  Most handlers of an unsampled message never do."""

    def __init__(self, trace_id: str, span_id: int, flags: int) -> None:  # pylint: disable=super-init-not-called
        # Not NonRecordingSpan's __init__: it takes a context, made here on demand.  The
        # span id is drawn now: two threads asking at once must get the same one.
        self._trace_id = trace_id
        self._span_id = span_id
        self._flags = flags
        self._made: SpanContext | None = None

    def get_span_context(self) -> SpanContext:
        made = self._made
        if made is None:
            made = self._made = SpanContext(int(self._trace_id, 16), self._span_id, is_remote=False,
                                            trace_flags=TraceFlags(self._flags & TraceFlags.RANDOM_TRACE_ID))
        return made

    @property
    def _context(self) -> SpanContext:  # what NonRecordingSpan's own methods read
        return self.get_span_context()
