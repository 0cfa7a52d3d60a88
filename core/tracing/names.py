"""What Sluice's spans and metrics are called: the instrumentation scope, the schema,
the histograms' names, units and bucket bounds.

A module of its own, importing nothing of Sluice's: core.tracing.state reads these, and so
do the SDK-side modules (core.tracing.histograms, .recorded) that state loads only when
``SLUICE_OTEL`` is on, so that loading them never comes back to state.
"""
from __future__ import annotations

#: The instrumentation scope of every span and instrument.
SCOPE = "sluice"
#: The messaging semantic conventions these spans and metrics follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
#: Metric attribute for the message type (no semantic-convention name exists for it).
MESSAGE_TYPE = "sluice.message.type"

PROCESS_DURATION = "messaging.process.duration"
CRITICAL_TIME = "sluice.message.critical_time"
#: Bucket bounds in seconds: the messaging conventions' advice for durations; critical
#: time (which includes the wait in the queue) goes on to an hour.
DURATION_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
CRITICAL_TIME_BOUNDS = (*DURATION_BOUNDS, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: The histograms: unit, description and bounds (the SDK's instruments and
#: core.tracing.histograms both use these).
HISTOGRAMS = {
    PROCESS_DURATION: ("s", "Handler time per message (a batch handler's call shared out)", DURATION_BOUNDS),
    CRITICAL_TIME: ("s", "Processing ended - (DeliverAt or TimeSent): how late a message's work is done",
                    CRITICAL_TIME_BOUNDS),
}
