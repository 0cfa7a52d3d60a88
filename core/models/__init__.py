"""Every table the engine owns, as Django models: the bottom layer, so any package may query
any table.  Defined here: the queue registry, leases, failed messages, bulk operations and
unmanaged models of the delayed-store and outbox tables; in their own modules: processing
records (records.py), the monitoring tab's samples (monitoring.py) and alerts (alerts.py),
all importable from ``core.models``.  Queue *tables* are not here: see core/queues.py."""
from __future__ import annotations

from django.db import models

from core.conf import lenient_settings


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


class QueuePause(models.Model):
    """A paused queue: its pumps receive nothing until the row is gone (core/runtime/pauses.py).
    A table of its own, not a registry column: the registry is cached per process for
    seconds, while every pump must see a pause within one."""

    queue = models.CharField(max_length=64, primary_key=True)
    #: The database's clock.
    paused_at = models.DateTimeField()
    #: Who paused it: a dashboard user's name, or "<os user> (cli)".
    paused_by = models.CharField(max_length=150, default="", blank=True)

    class Meta:
        db_table = "sluice_queue_pause"


class Lease(models.Model):
    """A named lease: which process currently does a job only one should do (the
    delayed-message mover).  Times are the database's clock."""

    name = models.CharField(max_length=200, primary_key=True)
    holder = models.CharField(max_length=200, default="")
    expires_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sluice_lease"


# -- failed messages (core/failures/) -------------------------------------------------


class FailureStatus(models.TextChoices):
    UNRESOLVED = "unresolved", "unresolved"
    RETRY_PENDING = "retry_pending", "retry pending"
    RESOLVED = "resolved", "resolved"
    ARCHIVED = "archived", "archived"


class FailedMessage(models.Model):
    """A message that reached the error queue, ingested by core.failures: one row per
    message id and queue; a message that fails again updates its row and appends to its
    history."""

    #: The ``NServiceBus.MessageId`` header (else the error-queue row's Id).  Unique with
    #: ``original_queue``: the same id may fail in two queues, and each is its own record.
    message_id = models.CharField(max_length=255, db_index=True)
    #: ``NServiceBus.FailedQ``: the queue it failed in, where a retry sends it back.
    original_queue = models.CharField(max_length=255, default="")
    #: The first enclosed message type, without a .NET assembly suffix ("" when none).
    message_type = models.CharField(max_length=255, default="")
    exception_type = models.CharField(max_length=500, default="")
    exception_message = models.TextField(default="")
    stack_trace = models.TextField(default="")
    #: Stable hash of exception type + the frame where it was raised (no line numbers).
    group_key = models.CharField(max_length=40, default="")
    #: Readable group: "ValueError @ demo/handlers.py:fail".
    group_title = models.CharField(max_length=500, default="")
    #: When the latest failure happened (``NServiceBus.TimeOfFailure``, else ingestion time).
    time_of_failure = models.DateTimeField()
    #: Failed processing attempts of the latest failure (``Sluice.TotalFailedAttempts``).
    attempts = models.IntegerField(default=0)
    #: How many times the message reached the error queue.
    failure_count = models.IntegerField(default=1)
    status = models.CharField(max_length=16, choices=FailureStatus.choices, default=FailureStatus.UNRESOLVED)
    #: The error-queue headers (JSON text) and body, kept for retries.
    headers = models.TextField(default="{}")
    body = models.BinaryField(default=b"")
    #: time_of_failure of the first failure.
    first_failed_at = models.DateTimeField()
    #: When ingestion recorded the latest failure (this server's clock).
    last_failed_at = models.DateTimeField()
    retried_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True)
    #: Events, oldest first: {"at", "event": failed|retry|resolved|archived|restored, "exception_type",
    #: "message", …}.  The newest core.failures.HISTORY_LIMIT are kept.
    history = models.JSONField(default=list)
    # -- where the message belongs (the conversation view): from its headers at ingestion, as
    # columns so a conversation's failures are an index range, not a scan of the headers' JSON.
    #: ``NServiceBus.ConversationId`` ("" when the message had none).
    conversation_id = models.CharField(max_length=200, default="")
    #: ``NServiceBus.RelatedTo``: the message whose handler sent this one (its parent in the flow).
    related_to = models.CharField(max_length=200, default="")
    #: ``NServiceBus.CorrelationId`` (a search by correlation id finds the conversation).
    correlation_id = models.CharField(max_length=255, default="")

    class Meta:
        db_table = "sluice_failed_message"
        ordering = ["-time_of_failure", "-id"]
        indexes = [
            models.Index(fields=["status", "time_of_failure"], name="sluice_fm_status_time"),
            models.Index(fields=["group_key", "status"], name="sluice_fm_group"),
            models.Index(fields=["original_queue", "status"], name="sluice_fm_queue"),
            models.Index(fields=["message_type", "status"], name="sluice_fm_type"),
            models.Index(fields=["time_of_failure"], name="sluice_fm_time"),
            models.Index(fields=["status", "archived_at"], name="sluice_fm_archived"),
            # Groups of a status (core.failures.groups, the dashboard) from the index alone.
            models.Index(fields=["status", "group_key", "time_of_failure", "id"], name="sluice_fm_status_groups"),
            # A conversation's failures, newest first (the conversation view), and the search.
            models.Index(fields=["conversation_id", "time_of_failure"], name="sluice_fm_conversation"),
            models.Index(fields=["correlation_id"], name="sluice_fm_correlation"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["message_id", "original_queue"], name="sluice_fm_message_queue"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} ({self.exception_type}, {self.status})"


class FailedGroup(models.Model):
    """Failed-message records counted per status and group (FailedMessage.group_key): kept by
    triggers on sluice_failed_message in the transaction of every write to it, whoever makes
    it (core/dialects/failed_counts_sql.py), so the largest groups are read, not grouped.
    A row whose ``records`` came back to 0 stays (its first and last are then None).  A
    migration that makes SQLite rebuild sluice_failed_message drops the triggers with the old
    table: it must install them again (tests/test_failed_counts.py would fail)."""

    status = models.CharField(max_length=16, choices=FailureStatus.choices)
    group_key = models.CharField(max_length=40)
    records = models.BigIntegerField(default=0)
    #: The earliest and latest time_of_failure of the group's records in this status.
    first_failed = models.DateTimeField(null=True)
    last_failed = models.DateTimeField(null=True)
    #: The group's title and exception type, as its newest record wrote them.
    title = models.CharField(max_length=500, default="")
    exception_type = models.CharField(max_length=500, default="")

    class Meta:
        db_table = "sluice_failed_group"
        constraints = [models.UniqueConstraint(fields=["status", "group_key"], name="sluice_fg_status_group")]
        # The largest groups of a status first (core.failures.groups), read in index order.
        indexes = [models.Index(fields=["status", "-records", "-last_failed"], name="sluice_fg_largest")]


class FailedQueueCount(models.Model):
    """Failed-message records counted per status and queue (FailedMessage.original_queue, as
    written: an endpoint's "queue@machine" is its own row), kept by the same triggers as
    :class:`FailedGroup`: the overview's failed counts, exact and read in one statement."""

    status = models.CharField(max_length=16, choices=FailureStatus.choices)
    queue = models.CharField(max_length=255)
    records = models.BigIntegerField(default=0)

    class Meta:
        db_table = "sluice_failed_queue"
        constraints = [models.UniqueConstraint(fields=["status", "queue"], name="sluice_fq_status_queue")]


class BulkOperationStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"


class BulkOperation(models.Model):
    """A retry or archive job over failed messages, run in batches; a page polls its counters."""

    #: "retry" or "archive".
    kind = models.CharField(max_length=16)
    #: What was selected, for people ("group ValueError @ demo/handlers.py:fail").
    description = models.CharField(max_length=500, default="")
    #: The selection, for the job (JSON: {"ids": [...]} | {"group": key} | {"all": true, "queue", ...}).
    selection = models.JSONField(default=dict)
    total = models.IntegerField(default=0)
    done = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    status = models.CharField(max_length=16, choices=BulkOperationStatus.choices,
                              default=BulkOperationStatus.PENDING)
    #: Why records failed (one line each, capped), or why the job stopped.
    error = models.TextField(default="", blank=True)
    requested_by = models.CharField(max_length=150, default="", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "sluice_bulk_operation"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}: {self.done}+{self.failed}/{self.total} {self.status}"

    @property
    def progress(self) -> float:
        """0.0–1.0 for a progress bar."""
        if self.status == BulkOperationStatus.FINISHED:
            return 1.0
        return min((self.done + self.failed) / self.total, 1.0) if self.total else 0.0


# -- the delayed store and outbox tables (SQL owned by core/dialects; read-only models) ----------


class DelayedMessageRow(models.Model):
    """A row of the delayed-message store table (``SLUICE_DELAYED_TABLE``), for reading
    through the ORM and the admin.  Storing and moving go through core.delayed."""

    id = models.CharField(max_length=250, primary_key=True, db_column="Id")
    destination = models.CharField(max_length=200, db_column="Destination")
    state = models.BinaryField(null=True, db_column="State")
    time = models.DateTimeField(db_column="Time")
    headers = models.TextField(db_column="Headers")
    retry_count = models.IntegerField(default=0, db_column="RetryCount")

    class Meta:
        managed = False
        db_table = lenient_settings().delayed_table
        ordering = ["time", "id"]
        verbose_name = "delayed message"

    def __str__(self) -> str:
        return f"{self.id} → {self.destination} at {self.time}"


class OutboxRecord(models.Model):
    """A record of the outbox table (``SLUICE_OUTBOX_TABLE``), for reading through the ORM
    and the admin.  Storing and dispatching go through core.outbox."""

    message_id = models.CharField(max_length=200, primary_key=True, db_column="MessageId")
    dispatched = models.BooleanField(default=False, db_column="Dispatched")
    dispatched_at = models.DateTimeField(null=True, db_column="DispatchedAt")
    persistence_version = models.CharField(max_length=23, db_column="PersistenceVersion")
    operations = models.TextField(db_column="Operations")
    created_at = models.DateTimeField(db_column="CreatedAt")
    quarantined = models.BooleanField(default=False, db_column="Quarantined")
    last_error = models.TextField(null=True, db_column="LastError")

    class Meta:
        managed = False
        db_table = lenient_settings().outbox_table
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.message_id} ({'dispatched' if self.dispatched else 'undispatched'})"


# -- processing records and the analytics pipeline (core/records/) -------------------------
from core.models.records import ExportWatermark, MetricWindow, PipelineRun, ProcessingRecord  # noqa: E402,F401

# -- the monitoring tab's queue-length history (core/monitoring/queue_samples.py) -----------------------
from core.models.monitoring import QueueHour, QueueMinute, QueueSample, RollupMark  # noqa: E402,F401

# -- alerts (core/alerts/) -------------------------------------------------------------------
from core.models.alerts import (  # noqa: E402,F401
    Alert,
    AlertDelivery,
    AlertRule,
    AlertTarget,
    Silence,
    WorkerSighting,
)

# -- Django tasks' results (core/tasks/) -----------------------------------------------------
from core.models.tasks import TaskResultRecord, TaskStatus  # noqa: E402,F401

from core.models.limits import QueueLimit, QueueSlot, QueueTicket  # noqa: E402,F401
