"""Sluice's own Django models.  Queue *tables* are not here: see core/queues.py."""
from __future__ import annotations

from django.db import models


class QueueKind(models.TextChoices):
    NORMAL = "normal", "normal"
    ERROR = "error", "error"
    DEAD_LETTER = "dead_letter", "dead-letter"
    TEMPORARY = "temporary", "temporary"


class QueueRecord(models.Model):
    """The registry of queues: one row per queue table, with its settings."""

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=QueueKind.choices, default=QueueKind.NORMAL)
    #: Default TTL, also the ceiling for a message's own TTL (None: messages live forever).
    default_ttl_seconds = models.FloatField(null=True, blank=True)
    #: Move expired messages to ``dead_letter_queue`` instead of dropping them.
    dead_letter_on_expiry = models.BooleanField(default=False)
    dead_letter_queue = models.CharField(max_length=64, null=True, blank=True)
    #: Temporary queues are deleted after this many idle seconds (minimum 300).
    auto_delete_on_idle_seconds = models.IntegerField(null=True, blank=True)
    last_activity = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "sluice_queue"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Lease(models.Model):
    """A named lease: which process currently does a job only one should do (the
    delayed-message mover).  Times are the database's clock."""

    name = models.CharField(max_length=200, primary_key=True)
    holder = models.CharField(max_length=200, default="")
    expires_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sluice_lease"
