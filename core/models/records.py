"""Tables of processing records and the analytics pipeline (core.records).

Record times are integer microseconds since the Unix epoch (UTC): the same type on
every database, nothing to convert on the pump's hot path, and the export turns a
whole column into a Parquet timestamp at once.
"""
from __future__ import annotations

import datetime as dt

from django.db import models

from pipeline import schema

OUTCOME_CHOICES = [(o, o.replace("_", " ")) for o in schema.OUTCOMES]


class ProcessingRecord(models.Model):
    """One handled message (one attempt): written by the pump in its receive transaction,
    exported to Parquet by `sluice records export`, deleted after the retention."""

    message_id = models.CharField(max_length=200)
    message_type = models.CharField(max_length=300, null=True)
    queue = models.CharField(max_length=64)
    endpoint = models.CharField(max_length=200)
    #: ``NServiceBus.TimeSent`` (None when the header is missing or unreadable).
    time_sent_us = models.BigIntegerField(null=True)
    started_us = models.BigIntegerField()
    ended_us = models.BigIntegerField()
    outcome = models.CharField(max_length=16, choices=OUTCOME_CHOICES)
    #: 1 for the first attempt, counting every failed attempt before this one.
    attempt = models.IntegerField(default=1)
    #: ``NServiceBus.DeliverAt`` of a delayed send (None otherwise): critical time counts
    #: from here, as NServiceBus does (ProcessingEnded − (DeliverAt ?? TimeSent)).
    deliver_at_us = models.BigIntegerField(null=True)
    # -- where the message belongs (the conversation view) and who handled it (monitoring) --
    #: ``NServiceBus.ConversationId``: every message a conversation's first send caused.
    conversation_id = models.CharField(max_length=200, null=True)
    #: ``NServiceBus.RelatedTo``: the id of the message whose handler sent this one.
    related_to = models.CharField(max_length=200, null=True)
    correlation_id = models.CharField(max_length=255, null=True)
    #: send / publish / reply, or delayed (DeliverAt) / retry (an operator's retry).
    intent = models.CharField(max_length=16, null=True)
    originating_endpoint = models.CharField(max_length=200, null=True)
    originating_host = models.CharField(max_length=200, null=True)
    #: The worker process that handled it (``host:pid``, as its heartbeat names it).
    worker = models.CharField(max_length=200, null=True)
    #: The W3C trace id of the message's ``traceparent`` header (tracing on), 32 hex digits.
    trace_id = models.CharField(max_length=32, null=True)

    class Meta:
        db_table = "sluice_processing_record"
        indexes = [
            models.Index(fields=["ended_us"], name="sluice_prec_ended"),
            # A conversation's records (the conversation view), newest first.
            models.Index(fields=["conversation_id", "ended_us"], name="sluice_prec_conversation"),
            # One queue's recent records (the monitoring tab, alert rules): an index range.
            models.Index(fields=["queue", "ended_us"], name="sluice_prec_queue_ended"),
            # A search by message id finds the conversation (the conversation view).  No index on
            # correlation_id: every index costs each pump batch's insert, and a correlation id is
            # a message id unless the sender chose one (core.records.conversations.find).
            models.Index(fields=["message_id"], name="sluice_prec_message"),
        ]

    @property
    def ended(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.ended_us / 1e6, dt.timezone.utc)


class ExportWatermark(models.Model):
    """The highest record id already in the Parquet data set (moved only after the files
    are in place, so a crash in between re-exports, never skips), and what the next
    export needs to know to pass no committed record over (core.records.export)."""

    name = models.CharField(max_length=64, primary_key=True)
    last_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)
    #: The highest record id visible when the horizon was taken: once every transaction
    #: open then has ended, no id at or below it can still appear.
    horizon_id = models.BigIntegerField(null=True)
    #: What tells that those transactions have ended (PostgreSQL: the snapshot's text).
    horizon_token = models.TextField(default="")
    #: When the horizon was taken (exporter's clock, µs): the time bound of databases
    #: that cannot tell (SQL Server).
    horizon_us = models.BigIntegerField(null=True)
    #: The earliest ``ended`` (µs) among exported records whose windows are not loaded
    #: yet: the next pipeline run recomputes from its hour (None: nothing pending).
    pending_since_us = models.BigIntegerField(null=True)

    class Meta:
        db_table = "sluice_records_watermark"


class RunStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    SKIPPED = "skipped", "skipped (another run held the lease)"


class PipelineRun(models.Model):
    """One run of export + Spark job + load: what the dashboard shows as the last run and
    as the progress of a run an operator started."""

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    #: export / job / load / retention / done
    stage = models.CharField(max_length=32, default="")
    progress = models.IntegerField(default=0)
    trigger = models.CharField(max_length=200, default="")
    since = models.DateTimeField(null=True)
    spark_master = models.CharField(max_length=200, default="")
    exported = models.BigIntegerField(default=0)
    windows = models.BigIntegerField(default=0)
    deleted = models.BigIntegerField(default=0)
    seconds = models.FloatField(null=True)
    error = models.TextField(default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sluice_pipeline_run"
        ordering = ["-id"]


class MetricWindow(models.Model):
    """One queue's figures for one message type and time window (the Spark job's output).
    A re-run of a window replaces its row."""

    queue = models.CharField(max_length=64)
    message_type = models.CharField(max_length=300)
    window_start = models.DateTimeField()
    window_seconds = models.IntegerField()
    messages = models.BigIntegerField()
    throughput_per_s = models.FloatField()
    processing_ms_p50 = models.FloatField(null=True)
    processing_ms_p95 = models.FloatField(null=True)
    processing_ms_p99 = models.FloatField(null=True)
    critical_ms_p50 = models.FloatField(null=True)
    critical_ms_p95 = models.FloatField(null=True)
    critical_ms_p99 = models.FloatField(null=True)
    failure_rate = models.FloatField()
    failures = models.BigIntegerField(default=0)
    retries = models.BigIntegerField(default=0)
    expired = models.BigIntegerField(default=0)
    dead_lettered = models.BigIntegerField(default=0)

    class Meta:
        db_table = "sluice_metric_window"
        constraints = [models.UniqueConstraint(fields=["window_seconds", "window_start", "queue", "message_type"],
                                               name="sluice_metric_window_key")]
        indexes = [models.Index(fields=["queue", "window_seconds", "window_start"], name="sluice_mw_queue")]
        ordering = ["window_start", "queue", "message_type"]
