"""The switch: whether this process traces and measures, and with which providers.

Hot paths read :data:`current` (None: off) once per call and do nothing more when it is
None.  :func:`install` sets it from providers given explicitly — a test's in-memory ones,
or the SDK's (:mod:`core.tracing.sdk`) — so the engine never has to fight over
OpenTelemetry's process-global provider, which can be set only once per process.
"""
from __future__ import annotations

import functools
import logging
import random
from typing import TYPE_CHECKING, Callable

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from core.conf import get_settings
# What the spans and metrics are called; also importable from here, as before.
from core.tracing.names import (  # noqa: F401
    CRITICAL_TIME, CRITICAL_TIME_BOUNDS, DURATION_BOUNDS, HISTOGRAMS, MESSAGE_TYPE, PROCESS_DURATION, SCHEMA_URL,
    SCOPE,
)
from core import __version__

if TYPE_CHECKING:  # core.tracing.histograms and .recorded need the SDK, an optional extra (and import
    # core.tracing.names, never this module: the contract in pyproject.toml keeps it so)
    from core.tracing.histograms import Histograms
    from core.tracing.recorded import Recorder

log = logging.getLogger("sluice.tracing")


class Instruments:
    """Every metric Sluice records (seconds for durations)."""

    def __init__(self, meter: metrics.Meter) -> None:
        # The semantic conventions' names.
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", "{message}", "Messages a pump received and settled")
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", "{message}", "Messages sent (queued or scheduled)")
        self.process_duration = _histogram(meter, PROCESS_DURATION)
        # Sluice's own (NServiceBus's set: successes, failures, retries, critical time).
        self.processed = meter.create_counter(
            "sluice.messages.processed", "{message}", "Messages whose handler succeeded")
        self.failed = meter.create_counter(
            "sluice.messages.failed", "{message}", "Failed processing attempts (each attempt counts)")
        self.retried = meter.create_counter(
            "sluice.messages.retried", "{message}", "Failed attempts followed by an immediate or delayed retry")
        self.moved_to_error = meter.create_counter(
            "sluice.messages.moved_to_error", "{message}", "Messages moved to the error queue")
        self.critical_time = _histogram(meter, CRITICAL_TIME)


def _histogram(meter: metrics.Meter, name: str) -> metrics.Histogram:
    unit, description, bounds = HISTOGRAMS[name]
    return meter.create_histogram(name, unit, description, explicit_bucket_boundaries_advisory=bounds)


class Telemetry:
    """The tracer, meter and instruments in use while tracing is on."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider,
                 histograms: Histograms | None = None, recorder: Recorder | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        #: Where the per-message histograms go when Sluice set up the metrics SDK itself
        #: (core.tracing.histograms); None: through the meter's instruments.
        self.histograms = histograms
        #: False with the no-op meter (OTEL_METRICS_EXPORTER=none): nothing to measure.
        self.measures = not isinstance(meter_provider, metrics.NoOpMeterProvider)
        self.tracer = tracer_provider.get_tracer(SCOPE, __version__, schema_url=SCHEMA_URL)
        self.meter = meter_provider.get_meter(SCOPE, __version__, schema_url=SCHEMA_URL)
        self.instruments = Instruments(self.meter)
        #: Whether a message whose sender was not sampled gets an unsampled process span
        #: whatever else (OpenTelemetry's default, parent-based sampling): then that span is
        #: made without the sampler (core.tracing.consuming), a third of a message's cost.
        self.follows_unsampled_parent = follows_unsampled_parent(self.tracer)
        #: A new span id, as the tracer's id generator makes them (core.tracing.consuming's
        #: unsampled spans).
        self.new_span_id = span_id_source(self.tracer)
        #: Sluice's own span recorder when it built the whole trace pipeline (core.tracing.sdk):
        #: sampled process spans skip the SDK's span machinery (core.tracing.recorded).
        self.recorder = recorder
        #: Queues whose length and oldest age are observed (core.monitoring.gauges).
        self.observed_queues: set[str] = set()
        self.gauges_registered = False


def follows_unsampled_parent(tracer: trace.Tracer) -> bool:
    """True when ``tracer`` is the SDK's and its sampler is the SDK's ``ParentBased``, which
    drops a span whose remote parent was not sampled (unless configured otherwise: asked,
    not assumed).  Any other sampler decides for every span itself."""
    try:
        # The SDK is the optional [otel] extra: without it there is no ParentBased to trust.
        from opentelemetry.sdk.trace.sampling import ParentBased  # noqa: PLC0415
    except ImportError:
        return False
    sampler = getattr(tracer, "sampler", None)
    if not isinstance(sampler, ParentBased) or not hasattr(tracer, "id_generator"):
        return False
    unsampled = trace.NonRecordingSpan(trace.SpanContext(1, 1, is_remote=True, trace_flags=trace.TraceFlags(0)))
    probe = sampler.should_sample(trace.set_span_in_context(unsampled), 1, "process", trace.SpanKind.CONSUMER)
    return not probe.decision.is_recording()


def span_id_source(tracer: trace.Tracer) -> Callable[[], int] | None:
    """The tracer's way of making a span id (None: a tracer without an id generator): its
    id generator's, or — for the SDK's random generator, which draws 64 random bits until
    they are not all zero — that draw itself, without a Python call.  Its caller draws
    again on 0 (once in 2⁶⁴ draws)."""
    generator = getattr(tracer, "id_generator", None)
    if generator is None:
        return None
    try:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: PLC0415 — the optional SDK
    except ImportError:
        return generator.generate_span_id
    if type(generator) is not RandomIdGenerator:  # noqa: E721 — exactly the SDK's, not a subclass
        return generator.generate_span_id
    return functools.partial(random.getrandbits, 64)


#: None: tracing is off (the default).  Read as ``state.current``, never imported by name:
#: :func:`install` replaces it.
current: Telemetry | None = None


def active() -> Telemetry | None:
    return current


def install(tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None,
            histograms: Histograms | None = None, recorder: Recorder | None = None) -> Telemetry:
    """Trace and measure with these providers (default: OpenTelemetry's global ones);
    ``histograms``: the aggregates the meter provider's exporter adds, ``recorder``: the
    tracer provider's span recorder (both core.tracing.sdk)."""
    global current
    current = Telemetry(tracer_provider or trace.get_tracer_provider(),
                        meter_provider or metrics.get_meter_provider(), histograms, recorder)
    return current


def uninstall() -> None:
    """Tracing off: the hot paths go back to doing nothing."""
    global current
    current = None


def configure() -> Telemetry | None:
    """At start-up (core.apps): with ``SLUICE_OTEL`` on, set up the SDK from the standard
    ``OTEL_*`` variables and install it; off, leave tracing off."""
    if not get_settings().OTEL:
        return None
    if current is not None:
        return current
    try:
        # Imported here, not at the top: the SDK and exporters are the optional [otel] extra,
        # and a process with tracing off must not need them.
        from core.tracing import sdk  # noqa: PLC0415
    except ImportError as exc:
        log.error("SLUICE_OTEL is on but the OpenTelemetry SDK is not installed (%s): "
                  "pip install 'django-sluice[otel]'; tracing stays off", exc)
        return None
    return install(*sdk.providers())
