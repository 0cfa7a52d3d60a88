"""Per-queue limits across the worker pool (core/runtime/limits.py): an operator's
override of SLUICE_QUEUE_LIMITS, and the rows receives lock to stay within a limit."""
from __future__ import annotations

from django.db import models


class QueueLimit(models.Model):
    """An operator's limits for a queue, set from the dashboard, the API or the command
    line; they win over SLUICE_QUEUE_LIMITS (a row with both None lifts the setting's)."""

    queue = models.CharField(max_length=64, primary_key=True)
    #: Messages of the queue handled at once across every worker; None: no such limit.
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    #: Messages of the queue taken per second across every worker; None: no such limit.
    rate = models.PositiveIntegerField(null=True, blank=True)
    #: The database's clock.
    set_at = models.DateTimeField()
    set_by = models.CharField(max_length=150, default="", blank=True)

    class Meta:
        db_table = "sluice_queue_limit"


class QueueSlot(models.Model):
    """One of a limited queue's concurrency slots (numbered from 1): a receive holds one
    row lock for its transaction, so a killed worker's slot comes back when the database
    ends its transaction."""

    queue = models.CharField(max_length=64)
    slot = models.PositiveIntegerField()

    class Meta:
        db_table = "sluice_queue_slot"
        constraints = [models.UniqueConstraint(fields=["queue", "slot"], name="sluice_queue_slot_uniq")]


class QueueTicket(models.Model):
    """One of a rate-limited queue's R tickets (numbered from 1): a message taken uses one,
    which is free again one second after the transaction that used it wrote ``used_at``
    (the database's clock, at the end of that transaction); a rollback leaves it as it was."""

    queue = models.CharField(max_length=64)
    ticket = models.PositiveIntegerField()
    used_at = models.DateTimeField()

    class Meta:
        db_table = "sluice_queue_ticket"
        constraints = [models.UniqueConstraint(fields=["queue", "ticket"], name="sluice_queue_ticket_uniq")]
