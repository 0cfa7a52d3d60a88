"""Django tasks' results (core.tasks): one row per enqueued task, written in the
enqueuing transaction and updated by each attempt in the receive's transaction."""
from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class TaskStatus(models.TextChoices):
    """The framework's TaskResultStatus values (stored as text; core.tasks maps them)."""

    READY = "READY", "ready"
    RUNNING = "RUNNING", "running"
    SUCCESSFUL = "SUCCESSFUL", "successful"
    FAILED = "FAILED", "failed"


class TaskResultRecord(models.Model):
    """A task's result: status, times (the database's clock), errors of each failed
    attempt, the workers that ran it, the JSON return value.  ``id`` is the task
    message's MessageId, so the message pages link here."""

    id = models.CharField(max_length=64, primary_key=True)
    task_path = models.CharField(max_length=300)
    backend = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=64)
    priority = models.IntegerField(default=0)
    args_kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.READY)
    # The database's clock, returned by the INSERT (db_default): no clock of an app server.
    enqueued_at = models.DateTimeField(db_default=Now())
    run_after = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    #: [{"exception_class_path": …, "traceback": …}, …], one per failed attempt.
    errors = models.JSONField(default=list)
    #: One entry per attempt (its length is the attempt count, as the framework counts).
    worker_ids = models.JSONField(default=list)
    return_value = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "sluice_task_result"
        indexes = [
            # The retention's finished results, oldest first.  Partial: an enqueue's READY row
            # (finished_at NULL) pays no entry in it, a tenth of a task's enqueue.
            models.Index(fields=["finished_at"], name="sluice_task_finished",
                         condition=models.Q(finished_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id} ({self.status})"
