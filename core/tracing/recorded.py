"""Sampled ``process`` spans recorded without the SDK's span machinery, when Sluice built
the whole trace pipeline itself.

An SDK span costs about 50 µs of Python before it is exported (its lock, bounded
attribute and event containers, the cleaning of every attribute, the read-only copy made
at its end): a third of a message's whole processing.  When ``SLUICE_OTEL=1`` set up the
SDK — Sluice's tracer provider, whose only processor is Sluice's batch processor feeding
Sluice's OTLP exporter (core.tracing.span_exporter) — nobody else sees these spans but
that exporter, so a message whose sender was sampled gets a :class:`RecordedSpan`: the
same span, the same ids, parent, attributes, events and status, handed to the same batch
processor, for a tenth of the cost.  tests/test_tracing_recorded.py runs the same
messages through both and compares what reached the collector.

It stands aside (:meth:`Recorder.usable`) as soon as the pipeline is not only Sluice's:
another span processor added to the provider, a sampler other than the SDK's parent-based
or always-on ones (or one that would decide differently for a sampled parent), attribute
values truncated by ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, the SDK's own
self-metrics switched on, or the SDK disabled (``OTEL_SDK_DISABLED``).
"""
from __future__ import annotations

import logging
import os
import threading
import traceback
from time import time_ns
from typing import Any, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

from core.tracing.names import SCHEMA_URL, SCOPE
from core import __version__

log = logging.getLogger("sluice.tracing")

_UNSET = Status(StatusCode.UNSET)
#: Attributes a span must have room for (Sluice sets up to a dozen; a handler adds some).
ROOM = 32
_SAMPLED_FLAGS = {flags: TraceFlags(TraceFlags.SAMPLED | (flags & TraceFlags.RANDOM_TRACE_ID)) for flags in range(256)}


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


class SluiceTracerProvider(TracerProvider):
    """The SDK's tracer provider, counting the span processors added to it: Sluice adds
    one; a second (the application's) means spans must go through the SDK again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.processors_added = 0

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.processors_added += 1


class Recorder:
    """Makes :class:`RecordedSpan` s for ``provider``, whose one processor is ``processor``."""

    def __init__(self, provider: SluiceTracerProvider, processor: SpanProcessor) -> None:
        self.provider = provider
        self.processor = processor
        self.scope = InstrumentationScope(SCOPE, __version__, SCHEMA_URL)
        self.limits = SpanLimits()
        self.generate_span_id = provider.id_generator.generate_span_id
        #: Slow paths only (a handler's own attributes and events, the end): a span may be
        #: touched from several threads, and the SDK's spans are safe for that.
        self.lock = threading.Lock()
        self._fits = (self._sampler_keeps_sampled_parents() and self._limits_need_no_truncation()
                      and not _env_true("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED") and not _env_true("OTEL_SDK_DISABLED"))

    def usable(self) -> bool:
        return self._fits and self.provider.processors_added == 1

    def start(self, name: str, parent: SpanContext, attributes: dict[str, Any]) -> "RecordedSpan":
        """A CONSUMER span, child of ``parent`` (a sampled remote span context without trace
        state), with ``attributes`` (clean values: strings and integers Sluice made)."""
        context = SpanContext(parent.trace_id, self.generate_span_id(), False, _SAMPLED_FLAGS[parent.trace_flags])
        return RecordedSpan(self, name, context, parent, attributes)

    def _sampler_keeps_sampled_parents(self) -> bool:
        """The provider's sampler is the SDK's ``ParentBased`` (every ``parentbased_*``
        choice) or always-on, and records and samples a span whose remote parent was
        sampled, adding no attributes and keeping the (empty) trace state — asked for trace
        ids across the range, since a ratio sampler decides by them.  Any other sampler
        (a bare ratio, one of the application's) decides each span through the SDK."""
        sampler = self.provider.sampler
        if not isinstance(sampler, (ParentBased, StaticSampler)):
            return False
        parent = trace.NonRecordingSpan(SpanContext(1, 1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        context = trace.set_span_in_context(parent)
        for trace_id in (1, (1 << 64) - 1, (1 << 127) + 12345, (1 << 128) - 1):
            probe = sampler.should_sample(context, trace_id, "process", SpanKind.CONSUMER)
            if not probe.decision.is_sampled() or probe.attributes or probe.trace_state:
                return False
        return True

    def _limits_need_no_truncation(self) -> bool:
        """No value is cut short, and Sluice's own dozen attributes all fit."""
        limits = self.limits
        return (limits.max_span_attribute_length is None and limits.max_attribute_length is None
                and (limits.max_span_attributes is None or limits.max_span_attributes >= ROOM))


class RecordedSpan(trace.Span):
    """A sampled span in the shape the batch processor and the exporter read (the SDK's
    ``ReadableSpan`` attributes).  Calls from elsewhere (a handler's own attributes and
    events) go through the SDK's bounded containers, made on first use, so they obey the
    SDK's rules: cleaning, limits, what may change after the end."""

    __slots__ = ("_recorder", "name", "context", "parent", "attributes", "status", "start_time", "end_time",
                 "instrumentation_scope", "_events", "_links")
    kind = SpanKind.CONSUMER
    # The rest of what the exporter reads, as plain values rather than properties: it
    # reads them for every span, and they change only when a handler adds an attribute, an
    # event or a link (most spans keep these defaults of the class).
    events: Sequence[Event] = ()
    links: Sequence[Link] = ()
    dropped_attributes = 0
    dropped_events = 0
    dropped_links = 0

    def __init__(self, recorder: Recorder, name: str, context: SpanContext, parent: SpanContext,
                 attributes: dict[str, Any]) -> None:
        self._recorder = recorder
        self.name = name
        self.context = context
        self.parent = parent
        #: Sluice's own (clean) values as a plain dict, until something else sets one.
        self.attributes: dict[str, Any] | BoundedAttributes = attributes
        self.status = _UNSET
        self.start_time = time_ns()
        self.end_time: int | None = None
        self.instrumentation_scope: InstrumentationScope = recorder.scope
        self._events: BoundedList | None = None
        self._links: BoundedList | None = None

    # What the batch processor and the exporter read.
    @property
    def resource(self) -> Any:
        # The provider's, read when exported: a forked child's SDK gives its provider a
        # resource of its own (a new service.instance.id).
        return self._recorder.provider.resource

    # The span API.
    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def end(self, end_time: int | None = None) -> None:
        with self._recorder.lock:
            if self.end_time is not None:
                log.warning("Calling end() on an ended span.")
                return
            self.end_time = end_time if end_time is not None else time_ns()
        self._recorder.processor.on_end(self)  # type: ignore[arg-type]  # read as a ReadableSpan

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        with self._recorder.lock:
            if not self._ended("set_attribute"):
                attributes = self._bounded_attributes()
                attributes[key] = value
                self.dropped_attributes = attributes.dropped

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        with self._recorder.lock:
            if not self._ended("set_attributes"):
                bounded = self._bounded_attributes()
                bounded._set_items(attributes)  # what the SDK's span calls
                self.dropped_attributes = bounded.dropped

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        limits = self._recorder.limits
        event = Event(name, BoundedAttributes(limits.max_event_attributes, attributes, immutable=True), timestamp)
        self._append("events", limits.max_events, event, "add_event")

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if not (context and (context.is_valid or attributes or context.trace_state)):
            return  # the SDK keeps an invalid context's link only when it carries something
        limits = self._recorder.limits
        link = Link(context, BoundedAttributes(limits.max_link_attributes, attributes, immutable=True))
        self._append("links", limits.max_links, link, "add_link")

    def update_name(self, name: str) -> None:
        with self._recorder.lock:
            if not self._ended("update_name"):
                self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        with self._recorder.lock:
            if self._ended("set_status") or self.status.status_code is StatusCode.OK:
                return  # as the SDK: a status stays once OK, and UNSET is never set
            if isinstance(status, Status):
                if status.status_code is not StatusCode.UNSET:
                    self.status = status
            elif status is not StatusCode.UNSET:
                self.status = Status(status, description)

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        module, name = type(exception).__module__, type(exception).__qualname__
        found: dict[str, Any] = {
            "exception.type": f"{module}.{name}" if module and module != "builtins" else name,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        found.update(attributes or {})
        self.add_event("exception", found, timestamp)

    def _append(self, kind: str, limit: int | None, item: Any, call: str) -> None:
        """An event or a link (``kind``: ``events`` or ``links``), into its bounded list
        (made on first use: most spans have none); what the exporter reads follows."""
        with self._recorder.lock:
            if self._ended(call):
                return
            items = getattr(self, f"_{kind}")
            if items is None:
                items = BoundedList(limit)
                setattr(self, f"_{kind}", items)
            items.append(item)
            setattr(self, kind, tuple(items))
            setattr(self, f"dropped_{kind}", items.dropped)

    def _bounded_attributes(self) -> BoundedAttributes:
        attributes = self.attributes
        if not isinstance(attributes, BoundedAttributes):
            attributes = self.attributes = BoundedAttributes(self._recorder.limits.max_span_attributes, attributes,
                                                             immutable=False)
        return attributes

    def _ended(self, call: str) -> bool:
        if self.end_time is None:
            return False
        log.warning("Tried calling %s on an ended span.", call)
        return True
