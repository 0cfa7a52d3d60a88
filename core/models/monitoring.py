"""The monitoring tab's own tables: queue-length samples and the records summed per queue and
minute or hour (core.monitoring.queue_samples writes them)."""
from __future__ import annotations

from django.db import models

#: Seconds of each grain after 0: a sample is of grain g when it is the first in its step.
GRAINS = (60, 600, 3600)


class QueueSample(models.Model):
    """One queue's length at one instant (the database's clock, µs since the epoch)."""

    queue = models.CharField(max_length=64)
    at_us = models.BigIntegerField()
    #: Messages in the table (max − min RowVersion above the count cap: ``estimated``).
    length = models.BigIntegerField()
    estimated = models.BooleanField(default=False)
    #: The coarsest step this sample begins (:data:`GRAINS`: 0 none, 1 a minute, 2 ten
    #: minutes, 3 an hour): a long period reads only its coarse samples, not every one.
    grain = models.SmallIntegerField(default=0)

    class Meta:
        db_table = "sluice_queue_sample"
        indexes = [
            # One queue's samples in a period (the monitoring tab): an index range.
            models.Index(fields=["queue", "at_us"], name="sluice_qsample_queue_at"),
            # Its coarse samples over a long period.
            models.Index(fields=["queue", "grain", "at_us"], name="sluice_qsample_grain"),
            # The retention's oldest samples.
            models.Index(fields=["at_us"], name="sluice_qsample_at"),
        ]


def grain_of(at_us: int, previous_us: int | None) -> int:
    """The coarsest step (:data:`GRAINS`) a sample at ``at_us`` begins, given the sampler's
    previous sample (None: it has none, so every step begins here)."""
    grain = 0
    for level, seconds in enumerate(GRAINS, start=1):
        if previous_us is None or at_us // (seconds * 1_000_000) != previous_us // (seconds * 1_000_000):
            grain = level
    return grain


class QueueSums(models.Model):
    """One queue's processing records of one span of time, summed: what an hour or a range
    of the monitoring tab reads instead of every record."""

    queue = models.CharField(max_length=64)
    records = models.BigIntegerField()
    retried = models.BigIntegerField()
    failures = models.BigIntegerField()
    processing_sum_us = models.BigIntegerField()
    processing_n = models.BigIntegerField()
    critical_sum_us = models.BigIntegerField()
    critical_n = models.BigIntegerField()
    skewed = models.BigIntegerField()

    class Meta:
        abstract = True


#: The summed columns of a minute or an hour, in the order readers take them.
SUMS = ("records", "retried", "failures", "processing_sum_us", "processing_n", "critical_sum_us", "critical_n",
        "skewed")


class QueueMinute(QueueSums):
    """A queue's records of one minute, summed (core.monitoring.queue_samples rolls them up)."""

    minute_us = models.BigIntegerField()

    class Meta:
        db_table = "sluice_queue_minute"
        constraints = [models.UniqueConstraint(fields=["queue", "minute_us"], name="sluice_qminute_key")]
        indexes = [models.Index(fields=["minute_us"], name="sluice_qminute_at")]


class QueueHour(QueueSums):
    """A queue's minutes of one hour, summed once every minute of it is (a range of days
    reads a row per queue and hour, not sixty)."""

    hour_us = models.BigIntegerField()

    class Meta:
        db_table = "sluice_queue_hour"
        constraints = [models.UniqueConstraint(fields=["queue", "hour_us"], name="sluice_qhour_key")]
        indexes = [models.Index(fields=["hour_us"], name="sluice_qhour_at")]


#: The RollupMark of the pipeline's windows: when a run's windows were last loaded (µs of the
#: database's clock), so that readers keeping window rows know they were replaced.
WINDOWS_LOADED = "metric-windows-loaded"


class RollupMark(models.Model):
    """How far the minutes (``name`` "queue-minutes") or the hours ("queue-hours") are rolled
    up (µs, exclusive); or when the pipeline's windows were last loaded (:data:`WINDOWS_LOADED`)."""

    name = models.CharField(max_length=64, primary_key=True)
    until_us = models.BigIntegerField()

    class Meta:
        db_table = "sluice_rollup_mark"
