"""The processing-record data set and the metric results: column names, types and outcomes.

Shared by the exporter (core.records, which writes the data set with pyarrow), the Spark
job (which reads it) and the benchmark's generator, so all three agree on one layout:

    <SLUICE_RECORDS_PATH>/date=YYYY-MM-DD/records-<first id>.parquet

The Arrow schema of a record is in :mod:`pipeline.arrow_schema` (pyarrow takes a fifth of a
second to import: this module stays free of it, as every Django process loads it through
the records' model).  Times are UTC instants with microsecond precision; ``date`` (a hive-style partition
directory, the UTC date of ``ended``) lets a run read only the days it needs.
"""
from __future__ import annotations

#: What happened to one handled message (one record per attempt).
PROCESSED = "processed"        # the handler succeeded
FAILED = "failed"              # the handler failed for the last time: the message went to the error queue
RETRIED = "retried"            # the handler failed; an immediate or delayed retry follows
EXPIRED = "expired"            # expired when received: dropped, never handed to a handler
DEAD_LETTERED = "dead_lettered"  # expired when received: moved to the queue's dead-letter queue
ERROR_QUEUE = "error_queue"    # no handler ran: a poison row or no handler for its type
OUTCOMES = (PROCESSED, FAILED, RETRIED, EXPIRED, DEAD_LETTERED, ERROR_QUEUE)
#: Outcomes whose handler ran: they have a processing time.
HANDLER_RAN = (PROCESSED, FAILED, RETRIED)
#: Outcomes that count as failures in ``failure_rate``.
FAILURES = (FAILED, RETRIED, ERROR_QUEUE)

PARTITION = "date"

#: Window sizes the job computes, in seconds (1 minute, 1 hour).
WINDOWS = (60, 3600)
#: One result row: a queue, message type and window.
METRIC_COLUMNS = (
    "queue", "message_type", "window_start", "window_seconds", "messages", "throughput_per_s",
    "processing_ms_p50", "processing_ms_p95", "processing_ms_p99",
    "critical_ms_p50", "critical_ms_p95", "critical_ms_p99",
    "failure_rate", "failures", "retries", "expired", "dead_lettered",
)


def record_file_name(first_id: int) -> str:
    """The file one export run writes into each date directory: named by the run's first
    record id, so a run restarted after a crash overwrites what the crashed one renamed."""
    return f"records-{first_id:015d}.parquet"
