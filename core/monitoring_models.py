"""The monitoring tab's own table: queue-length samples (core.queue_samples writes them)."""
from __future__ import annotations

from django.db import models


class QueueSample(models.Model):
    """One queue's length at one instant (the database's clock, µs since the epoch)."""

    queue = models.CharField(max_length=64)
    at_us = models.BigIntegerField()
    #: Messages in the table (max − min RowVersion above the count cap: ``estimated``).
    length = models.BigIntegerField()
    estimated = models.BooleanField(default=False)

    class Meta:
        db_table = "sluice_queue_sample"
        indexes = [
            # One queue's samples in a period (the monitoring tab): an index range.
            models.Index(fields=["queue", "at_us"], name="sluice_qsample_queue_at"),
            # The retention's oldest samples.
            models.Index(fields=["at_us"], name="sluice_qsample_at"),
        ]
