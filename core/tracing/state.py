"""The switch: whether this process traces and measures, and with which providers.

Hot paths read :data:`current` (None: off) once per call and do nothing more when it is
None.  :func:`install` sets it from providers given explicitly — a test's in-memory ones,
or the SDK's (:mod:`core.tracing.sdk`) — so the engine never has to fight over
OpenTelemetry's process-global provider, which can be set only once per process.
"""
from __future__ import annotations

import logging

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from core.conf import get_settings
from sluice import __version__

log = logging.getLogger("sluice.tracing")

#: The instrumentation scope of every span and instrument.
SCOPE = "sluice"
#: The messaging semantic conventions these spans and metrics follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
#: Metric attribute for the message type (no semantic-convention name exists for it).
MESSAGE_TYPE = "sluice.message.type"


class Instruments:
    """Every metric Sluice records (seconds for durations)."""

    def __init__(self, meter: metrics.Meter) -> None:
        # The semantic conventions' names.
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages", "{message}", "Messages a pump received and settled")
        self.sent = meter.create_counter(
            "messaging.client.sent.messages", "{message}", "Messages sent (queued or scheduled)")
        self.process_duration = meter.create_histogram(
            "messaging.process.duration", "s", "Handler time per message (a batch handler's call shared out)")
        # Sluice's own (NServiceBus's set: successes, failures, retries, critical time).
        self.processed = meter.create_counter(
            "sluice.messages.processed", "{message}", "Messages whose handler succeeded")
        self.failed = meter.create_counter(
            "sluice.messages.failed", "{message}", "Failed processing attempts (each attempt counts)")
        self.retried = meter.create_counter(
            "sluice.messages.retried", "{message}", "Failed attempts followed by an immediate or delayed retry")
        self.moved_to_error = meter.create_counter(
            "sluice.messages.moved_to_error", "{message}", "Messages moved to the error queue")
        self.critical_time = meter.create_histogram(
            "sluice.message.critical_time", "s",
            "Processing ended - (DeliverAt or TimeSent): how late a message's work is done")


class Telemetry:
    """The tracer, meter and instruments in use while tracing is on."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer = tracer_provider.get_tracer(SCOPE, __version__, schema_url=SCHEMA_URL)
        self.meter = meter_provider.get_meter(SCOPE, __version__, schema_url=SCHEMA_URL)
        self.instruments = Instruments(self.meter)
        #: Queues whose length and oldest age are observed (core.tracing.gauges).
        self.observed_queues: set[str] = set()
        self.gauges_registered = False


#: None: tracing is off (the default).  Read as ``state.current``, never imported by name:
#: :func:`install` replaces it.
current: Telemetry | None = None


def active() -> Telemetry | None:
    return current


def install(tracer_provider: TracerProvider | None = None,
            meter_provider: MeterProvider | None = None) -> Telemetry:
    """Trace and measure with these providers (default: OpenTelemetry's global ones)."""
    global current
    current = Telemetry(tracer_provider or trace.get_tracer_provider(),
                        meter_provider or metrics.get_meter_provider())
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
                  "pip install 'sluice[otel]'; tracing stays off", exc)
        return None
    tracer_provider, meter_provider = sdk.providers()
    return install(tracer_provider, meter_provider)
