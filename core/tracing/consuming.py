"""Consumer-side spans and metrics: one ``process {queue}`` span (CONSUMER) per handler
call, and the measurements of a receive batch once it has committed.

Where a process span hangs from is decided by the message alone, never by the span
current in the pump's thread (a Celery task hosting the loop lives for hours):

- a message's first delivery (and its immediate retries): a child of its ``send`` span;
- a delayed send, a delayed retry, an operator's retry: a new trace with a link to the
  sender (the send may be days old: one trace should not span them);
- a batch handler's call: a new trace with a link to every message's sender.

While the handler runs, its span is the current one (with the message's baggage), so
what the handler sends — and what instrumented libraries do inside it — nests under it.

A failed call's span stays open until the pump has decided what becomes of the message
(an immediate retry, a delayed retry, the error queue): that decision is an event on it.

Metrics are recorded from the batch's final outcomes after its commit
(:meth:`BatchTrace.finish`): a chunk that rolled back and ran again is counted once,
and a batch that rolled back not at all.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import INVALID_SPAN, Span, SpanContext, SpanKind, StatusCode, TraceFlags

from core.messages import Headers, Message
from core.outcomes import MessageOutcome
from core.records.writer import sent_us
from core.tracing import state
from core.tracing.producing import SYSTEM, error_type
from core.tracing.parents import Unsampled, parent_of, starts_new_trace, trace_id_of_span
from core.tracing.propagation import links, plain_traceparent_parts

_EMPTY = Context()
#: The key under which a context holds its current span, asked of the public API (the
#: module that defines it keeps it private).
_SPAN_KEY = next(iter(trace.set_span_in_context(INVALID_SPAN, _EMPTY)))


def _context_switch() -> tuple[Any, Any]:
    """How a call makes its span current and stops: OpenTelemetry's attach and detach, or —
    with the default runtime context, a context variable — that variable's own set and
    reset, which is what those two end in after three more Python calls each (a message
    pays for both)."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime) is ContextVarsRuntimeContext and variable is not None:  # noqa: E721 — exactly the SDK's
        return variable.set, variable.reset
    return otel_context.attach, otel_context.detach


_attach, _detach = _context_switch()

#: On the span of a call whose work was rolled back with its savepoint (a later message
#: of its chunk failed): the call runs again, under a span of its own.
ROLLED_BACK = "sluice.rolled_back"

#: The event on a failed message's process span for each of the pump's decisions
#: (core.receive.recoverability.FailureOutcome values).
FAILURE_EVENTS = {"retry": "sluice.retry.immediate", "delayed-retry": "sluice.retry.delayed",
                  "error": "sluice.moved_to_error_queue"}


class Call:
    """One handler call's span, current while the handler runs."""

    __slots__ = ("batch", "span", "messages", "started", "recording", "trace_id", "_token")

    def __init__(self, batch: "BatchTrace", span: Span, messages: Sequence[Message], base: Context,
                 recording: bool, trace_id: str | None = None) -> None:
        self.batch = batch
        self.span = span
        self.messages = messages
        #: Whether the span records (an unsampled message's never does: nothing to end or hold).
        self.recording = recording
        #: The trace the span belongs to, for the processing records, when it is not the one
        #: the message's ``traceparent`` names (a delayed delivery's, a retry's, a batch
        #: call's new trace); None: that one.
        self.trace_id = trace_id
        # The span made current as trace.set_span_in_context would, without its copy of an
        # empty context.
        self._token = _attach(Context({_SPAN_KEY: span}) if base is _EMPTY else trace.set_span_in_context(span, base))
        self.started = time.perf_counter()

    def done(self) -> None:
        """The handler returned."""
        took = time.perf_counter() - self.started
        _detach(self._token)
        batch = self.batch
        messages = self.messages
        if len(messages) == 1:
            batch.durations[id(messages[0])] = took  # a re-run after a rollback overwrites
        else:
            share = took / len(messages)
            for message in messages:
                batch.durations[id(message)] = share
        if not self.recording:
            return
        if batch.work_rolls_back:
            batch.hold(self.span)
        else:  # receive_only: the handler's work committed on its own connection already
            self.span.end()

    def raised(self, exc: BaseException) -> None:
        """The handler raised: a single message's span waits for the pump's decision
        (:meth:`BatchTrace.failed`); a batch call's ends (it runs again message by message)."""
        _detach(self._token)
        self.span.set_attribute("error.type", error_type(exc))
        self.span.set_status(StatusCode.ERROR, str(exc)[:200])
        if len(self.messages) > 1:
            self.span.end()

    def undecided(self) -> None:
        """The pump could not decide what becomes of the failed message (its
        recoverability step raised, and the receive rolls back): a single message's span
        is held, to end with the receive (:meth:`BatchTrace.abandon`); a batch call's has
        ended already."""
        if len(self.messages) == 1:
            self.batch.hold(self.span)

    def abandoned(self, exc: BaseException) -> None:
        """Something other than an Exception stopped the handler (the thread is going):
        no decision will follow, so the span ends now."""
        self.raised(exc)
        if len(self.messages) == 1:
            self.span.end()


class BatchTrace:
    """The spans and measurements of one receive batch; made only while tracing is on."""

    def __init__(self, telemetry: state.Telemetry, queue: str, mode: str, received: int,
                 work_rolls_back: bool = True) -> None:
        self.telemetry = telemetry
        self.queue = queue
        self.name = f"process {queue}"
        self.common = {"messaging.system": SYSTEM, "messaging.operation.type": "process",
                       "messaging.operation.name": "process", "messaging.destination.name": queue,
                       "sluice.batch_size": received, "sluice.transaction_mode": mode}
        #: Seconds of handler time per message (by id()), from its last successful call.
        self.durations: dict[int, float] = {}
        #: Spans of calls that succeeded and of the pump's decisions, with their end times,
        #: held until what they describe is committed or rolled back (:meth:`rollback_to`,
        #: :meth:`finish`, :meth:`abandon`).
        self._held: list[tuple[Span, int]] = []
        #: Whether a handler's work rolls back with the receive (the transaction mode's
        #: word: every mode's but receive_only's, whose handlers write on a connection of
        #: their own).
        self.work_rolls_back = work_rolls_back
        self._metric_attributes_by_type: dict[str, dict[str, str]] = {}

    def _attributes(self, message: Message) -> dict[str, Any]:
        headers = message.headers
        attributes = {**self.common, "messaging.message.id": headers.get(Headers.MESSAGE_ID, message.id),
                      "sluice.attempt": message.total_failed_attempts + 1}
        conversation = headers.get(Headers.CONVERSATION_ID)
        if conversation:
            attributes["messaging.message.conversation_id"] = conversation
        if message.message_type:
            attributes["sluice.message.type"] = message.message_type
        return attributes

    def _start(self, message: Message) -> tuple[Span, Context, str | None]:
        """A message's span, the context it starts from, and its trace when that is not
        the one the message's ``traceparent`` names (:attr:`Call.trace_id`)."""
        short_cut = self._short_cut(message)
        if short_cut is not None:
            return short_cut, _EMPTY, None  # the sender's trace, as the traceparent says
        base, found = parent_of(message.headers)
        span = self.telemetry.tracer.start_span(self.name, context=base, kind=SpanKind.CONSUMER, links=found)
        if span.is_recording():
            # Set after the start, and only on a sampled span: cleaning a dozen attributes
            # was most of a span's cost, and an unsampled message should cost next to nothing.
            span.set_attributes(self._attributes(message))
        return span, base, trace_id_of_span(span)

    def _short_cut(self, message: Message) -> Span | None:
        """The span the SDK would make for a first delivery whose headers hold only a plain
        version-00 ``traceparent`` (no trace state, no baggage), made without the
        propagator and the SDK's span machinery; None when the SDK must decide.

        - Sender not sampled, under the SDK's parent-based sampler: a non-recording child
          (:class:`Unsampled`).
        - Sender sampled, when Sluice built the whole trace pipeline: a recorded span
          (core.tracing.recorded)."""
        headers = message.headers
        traceparent = headers.get(Headers.TRACEPARENT)
        if (not traceparent or Headers.TRACESTATE in headers or Headers.BAGGAGE in headers
                or starts_new_trace(headers)):
            return None
        parts = plain_traceparent_parts(traceparent)
        if parts is None:
            return None
        trace_id, span_id, flags = parts
        telemetry = self.telemetry
        if flags & TraceFlags.SAMPLED:
            recorder = telemetry.recorder
            if recorder is None or not recorder.usable():
                return None
            remote = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(flags))
            return recorder.start(self.name, remote, self._attributes(message))
        if not telemetry.follows_unsampled_parent:
            return None
        return Unsampled(trace_id, telemetry.new_span_id() or telemetry.tracer.id_generator.generate_span_id(), flags)

    def begin(self, messages: Sequence[Message]) -> Call:
        """The span of a handler call for ``messages`` (one, or a batch handler's list)."""
        if len(messages) == 1:
            span, base, trace_id = self._start(messages[0])
            # An unsampled span never records: no need to ask it.
            return Call(self, span, messages, base, type(span) is not Unsampled and span.is_recording(), trace_id)
        span = self.telemetry.tracer.start_span(
            self.name, context=Context(), kind=SpanKind.CONSUMER, links=links(m.headers for m in messages))
        recording = span.is_recording()
        if recording:
            span.set_attributes({**self.common, "messaging.batch.message_count": len(messages)})
        return Call(self, span, messages, Context(), recording, trace_id_of_span(span))

    def failed(self, message: Message, cause: BaseException, decision: str, call: Call | None) -> str | None:
        """The pump's decision for a failed message, as an event on its span (a span of
        its own when the failure had none: the database refused its sends); the span's
        trace for the message's processing record (:attr:`Call.trace_id`)."""
        if call is not None and len(call.messages) == 1:
            span, trace_id = call.span, call.trace_id
        else:
            span, _, trace_id = self._start(message)
            span.set_attribute("error.type", error_type(cause))
            span.set_status(StatusCode.ERROR, str(cause)[:200])
        span.add_event(FAILURE_EVENTS.get(decision, f"sluice.{decision}"),
                       {"sluice.attempt": message.total_failed_attempts + 1, "error.type": error_type(cause)})
        self.hold(span)  # the decision is written in the receive's transaction
        return trace_id

    def settled(self, message: Message, event: str, cause: BaseException | None = None,
                **attributes: Any) -> str | None:
        """A message no handler saw (expired, poison, no handler): its span and an event;
        the span's trace for the message's processing record (:attr:`Call.trace_id`)."""
        span, _, trace_id = self._start(message)
        if cause is not None:
            span.set_attribute("error.type", error_type(cause))
            span.set_status(StatusCode.ERROR, str(cause)[:200])
        span.add_event(event, attributes)
        self.hold(span)
        return trace_id

    def hold(self, span: Span) -> None:
        """``span`` is finished: it ends when what it describes is committed or rolled back
        (an unsampled span's end does nothing: nothing to hold)."""
        if span.is_recording():
            self._held.append((span, time.time_ns()))

    def mark(self) -> int:
        """Where a savepoint starts (core.receive.chunks journals, as the processing records)."""
        return len(self._held)

    def rollback_to(self, mark: int) -> None:
        """The savepoint rolled back: the calls since ``mark`` did work that did not count
        (they run again, with spans of their own); their spans say so and end."""
        for span, ended in self._held[mark:]:
            span.set_attribute(ROLLED_BACK, True)
            span.end(ended)
        del self._held[mark:]

    def abandon(self) -> None:
        """The receive's transaction did not commit: nothing held counted (the pump's
        decisions, and every mode's handler work but receive_only's, which is not held)."""
        self.rollback_to(0)

    def finish(self, messages: Sequence[Message], outcomes: Sequence[MessageOutcome]) -> None:
        """After the batch committed: the held spans end; the metrics, from each message's
        final outcome."""
        for span, ended in self._held:
            span.end(ended)
        self._held.clear()
        if not self.telemetry.measures:
            return
        # Per message type: the handler times and critical times of the successes.  Written
        # for the usual batch (one type, every message handled): a few passes in C over the
        # batch, no Python call per message.
        enclosed = Headers.ENCLOSED_MESSAGE_TYPES
        types = [message.headers.get(enclosed) or "" for message in messages]
        succeeded = MessageOutcome.SUCCEEDED
        took_by_id = self.durations
        by_type: dict[str, list[Message]]
        if types.count(types[0]) == len(types):
            one_type = types[0]
            counts: dict[tuple[MessageOutcome, str], int] = {
                (outcome, one_type): count for outcome, count in Counter(outcomes).items()}
            if outcomes.count(succeeded) == len(outcomes) and len(took_by_id) == len(messages):
                by_type = {one_type: list(messages)}
                took_by_type = {one_type: list(took_by_id.values())}
            else:
                by_type = {one_type: [m for m, outcome in zip(messages, outcomes) if outcome is succeeded]}
                took_by_type = None
        else:
            counts = Counter(zip(outcomes, types))
            by_type = {}
            for message, outcome, message_type in zip(messages, outcomes, types):
                if outcome is succeeded:
                    by_type.setdefault(message_type, []).append(message)
            took_by_type = None
        now_us = time.time_ns() // 1000
        deliver_at, time_sent = Headers.DELIVER_AT, Headers.TIME_SENT
        durations: dict[str, list[float]] = {}
        critical: dict[str, list[float]] = {}
        for message_type, of_type in by_type.items():
            if took_by_type is not None:
                took = took_by_type[message_type]
            else:
                took = [value for value in map(took_by_id.get, map(id, of_type)) if value is not None]
            sent = [sent_us(message.headers.get(deliver_at) or message.headers.get(time_sent)) for message in of_type]
            # A clock behind the sender's counts as no wait, not a negative one.
            late = [(now_us - value) / 1e6 if value < now_us else 0.0 for value in sent if value is not None]
            if took:
                durations[message_type] = took
            if late:
                critical[message_type] = late
        instruments = self.telemetry.instruments
        self._histograms(state.PROCESS_DURATION, instruments.process_duration, durations)
        self._histograms(state.CRITICAL_TIME, instruments.critical_time, critical)
        self._counters(counts)

    def _histograms(self, name: str, instrument: Any, values_by_type: dict[str, list[float]]) -> None:
        aggregates = self.telemetry.histograms
        for message_type, values in values_by_type.items():
            attributes = self._metric_attributes(message_type)
            if aggregates is not None:  # Sluice's own SDK set-up: one call per type and batch
                aggregates.record_all(name, tuple(attributes.items()), values)
            else:
                for value in values:
                    instrument.record(value, attributes)

    def _counters(self, counts: dict[tuple[MessageOutcome, str], int]) -> None:
        instruments = self.telemetry.instruments
        by_type: dict[str, int] = {}
        for (outcome, message_type), count in counts.items():
            attributes = self._metric_attributes(message_type)
            by_type[message_type] = by_type.get(message_type, 0) + count
            if outcome is MessageOutcome.SUCCEEDED:
                instruments.processed.add(count, attributes)
            elif outcome is MessageOutcome.RETRIED:
                instruments.failed.add(count, attributes)
                instruments.retried.add(count, attributes)
            elif outcome is MessageOutcome.ERRORED:
                instruments.failed.add(count, attributes)
                instruments.moved_to_error.add(count, attributes)
            elif outcome is MessageOutcome.POISON:
                instruments.moved_to_error.add(count, attributes)
        for message_type, count in by_type.items():
            instruments.consumed.add(count, self._metric_attributes(message_type))

    def _metric_attributes(self, message_type: str) -> dict[str, str]:
        found = self._metric_attributes_by_type.get(message_type)
        if found is None:  # one dict per type per batch: the SDK hashes it on every record
            found = self._metric_attributes_by_type[message_type] = {
                "messaging.system": SYSTEM, "messaging.destination.name": self.queue, state.MESSAGE_TYPE: message_type}
        return found


def batch_trace(queue: str, mode: str, received: int, work_rolls_back: bool = True) -> BatchTrace | None:
    """A receive batch's :class:`BatchTrace`, or None while tracing is off."""
    telemetry = state.current
    return None if telemetry is None else BatchTrace(telemetry, queue, mode, received, work_rolls_back)
