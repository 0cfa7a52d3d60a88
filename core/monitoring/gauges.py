"""Queue length and the age of the oldest message as observable gauges.

Read at the meter's collection interval (``OTEL_METRIC_EXPORT_INTERVAL``) with one
bounded statement per 200 queues (:func:`core.monitoring.measurements.queue_levels`), on the metric
reader's thread.  Only the queues a worker serves are observed (:func:`observe`), so a
web process with tracing on asks nothing.
"""
from __future__ import annotations

import logging
from typing import Iterable

from django.db import DatabaseError, connections
from opentelemetry.metrics import CallbackOptions, Observation

from core.conf import get_settings
from core.monitoring.measurements import queue_levels
from core.tracing import state
from core.tracing.producing import SYSTEM

log = logging.getLogger("sluice.tracing")


def observe(queues: Iterable[str]) -> None:
    """Observe these queues' length and oldest-message age (tracing on; else nothing)."""
    telemetry = state.current
    if telemetry is None:
        return
    telemetry.observed_queues.update(queues)
    if telemetry.gauges_registered:
        return
    telemetry.gauges_registered = True
    readings = Readings(telemetry)
    telemetry.meter.create_observable_gauge(
        "sluice.queue.length", [readings.lengths], "{message}",
        "Messages waiting in the queue (max - min RowVersion above a cap)")
    telemetry.meter.create_observable_gauge(
        "sluice.queue.oldest_message_age", [readings.ages], "s", "Age of the oldest message waiting in the queue")


class Readings:
    """One :func:`queue_levels` reading per collection, shared by both gauges."""

    def __init__(self, telemetry: state.Telemetry) -> None:
        self.telemetry = telemetry
        self._ages: list[Observation] = []

    def lengths(self, options: CallbackOptions) -> Iterable[Observation]:
        # The collection calls the gauges in the order they were made: lengths reads the
        # levels once and keeps the ages for the second gauge.
        self._ages = []
        names = sorted(self.telemetry.observed_queues)
        if not names:
            return []
        try:
            levels = queue_levels(names)
        except DatabaseError as exc:
            log.warning("queue levels for the metrics could not be read: %s", exc)
            return []
        finally:
            # The reader's own thread keeps no connection between collections (a collection
            # forced from a thread inside a transaction leaves that thread's alone).
            alias = get_settings().DATABASE
            if not connections[alias].in_atomic_block:
                connections[alias].close()
        lengths = []
        for level in levels:
            attributes = {"messaging.system": SYSTEM, "messaging.destination.name": level.name}
            if level.pending is not None:
                lengths.append(Observation(level.pending, attributes))
            if level.oldest_age_seconds is not None:
                self._ages.append(Observation(level.oldest_age_seconds, attributes))
        return lengths

    def ages(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._ages
