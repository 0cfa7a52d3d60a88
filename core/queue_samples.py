"""Queue-length history: every registered queue's length, sampled every
``SLUICE_MONITORING_SAMPLE_INTERVAL`` seconds into ``sluice_queue_sample`` (the monitoring
tab's queue-length sparklines; one process's memory would forget it on restart and know
only what that process saw).

:class:`QueueSampler` is a loop (core.loops): every worker hosts one where the delayed mover
runs, and only the holder of the ``queue-sampler`` lease samples, so one row per queue and
interval is written however many workers run.  A step reads the queues' lengths with
:func:`core.measurements.queue_levels` (capped counts, index lookups), writes them in one
INSERT and deletes at most :data:`DELETE_BATCH` samples older than
``SLUICE_MONITORING_SAMPLE_RETENTION``: bounded work, whatever the history holds.
"""
from __future__ import annotations

import logging
import time

from django.db import connections

from core.conf import get_settings
from core.dialects import dialect_for
from core.lease import Lease
from core.measurements import queue_levels
from core.monitoring_models import QueueSample, grain_of

log = logging.getLogger("sluice.monitoring")

LEASE_NAME = "queue-sampler"
#: Old samples one step deletes at most (the next steps delete the rest).
DELETE_BATCH = 5000


def database_now_us(using: str | None = None) -> int:
    """The database's clock, µs since the epoch: samples and monitoring periods are placed
    in the one clock every process shares."""
    using = using or get_settings().DATABASE
    d = dialect_for(connections[using], get_settings().SCHEMA)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])  # parameters (none): Django then reads %% as %
        now = d.to_datetime(cursor.fetchone()[0])
    return int(now.timestamp() * 1_000_000)


def sample_now(using: str | None = None, previous_us: int | None = None) -> tuple[int, int]:
    """Write one sample per registered queue now, ``previous_us`` the time of the previous
    sample (for its grain); returns (how many were written, their time)."""
    using = using or get_settings().DATABASE
    at = database_now_us(using)
    grain = grain_of(at, previous_us)
    rows = [QueueSample(queue=level.name, at_us=at, length=level.pending, estimated=level.estimated, grain=grain)
            for level in queue_levels() if level.pending is not None]
    QueueSample.objects.using(using).bulk_create(rows)
    return len(rows), at


def delete_old_samples(retention_seconds: float, using: str | None = None) -> int:
    """Delete at most :data:`DELETE_BATCH` samples older than the retention (the oldest first)."""
    using = using or get_settings().DATABASE
    cutoff = database_now_us(using) - int(retention_seconds * 1_000_000)
    old = list(QueueSample.objects.using(using).filter(at_us__lt=cutoff).order_by("at_us")
               .values_list("pk", flat=True)[:DELETE_BATCH])
    if not old:
        return 0
    return QueueSample.objects.using(using).filter(pk__in=old).delete()[0]


class QueueSampler:
    """The loop (see the module doc)."""

    name = "queue-sampler"

    def __init__(self, interval: float | None = None, lease_seconds: float | None = None) -> None:
        s = get_settings()
        self.interval = interval or s.MONITORING_SAMPLE_INTERVAL
        self.retention = s.MONITORING_SAMPLE_RETENTION
        self.lease = Lease(LEASE_NAME, lease_seconds or max(30.0, self.interval * 3), s.DATABASE)
        self.written = 0
        self._previous_us: int | None = None

    def step(self) -> float:
        if not self.lease.acquire():
            return min(self.interval, self.lease.follower_wait())
        started = time.monotonic()
        written, self._previous_us = sample_now(self.lease.using, self._previous_us)
        self.written += written
        delete_old_samples(self.retention, self.lease.using)
        # The next sample one interval after this one began, however long the step took.
        return max(0.0, self.interval - (time.monotonic() - started))

    def close(self) -> None:
        try:
            self.lease.release()
        except Exception:  # noqa: BLE001 — the lease lapses by itself
            log.debug("queue sampler lease not released", exc_info=True)
