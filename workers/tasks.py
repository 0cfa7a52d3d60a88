"""Periodic and operator-requested tasks.  The periodic clean-ups are core.maintenance's jobs:
each takes its lease first, so it never runs twice at once across workers (nor beside a
`sluice worker` that runs them itself), and works within a time budget."""
from __future__ import annotations

import datetime as dt
import logging

from celery import shared_task

from core.maintenance import run_job

log = logging.getLogger("sluice.tasks")


@shared_task(name="sluice.purge_expired")
def purge_expired() -> dict:
    return run_job("purge_expired")


@shared_task(name="sluice.delete_idle_queues")
def delete_idle_queues() -> list:
    return run_job("delete_idle_queues")


@shared_task(name="sluice.outbox_cleanup")
def outbox_cleanup() -> int:
    return run_job("outbox_cleanup")


@shared_task(name="sluice.ingest_errors")
def ingest_errors() -> int:
    return run_job("ingest_errors")


@shared_task(name="sluice.purge_archived_failures")
def purge_archived_failures() -> int:
    return run_job("purge_archived_failures")


@shared_task(name="sluice.prune_task_results")
def prune_task_results() -> int:
    """Django tasks' finished results past SLUICE_TASK_RESULTS_RETENTION (core.tasks)."""
    return run_job("prune_task_results")


@shared_task(name="sluice.run_bulk_operation", acks_late=True)
def run_bulk_operation(operation_id: int) -> dict:
    """Retry / archive / restore failed messages, or purge a queue, in batches; the operation
    row shows progress.
    Re-running after a worker died carries on where the last committed batch ended."""
    from core.failures import run_operation

    op = run_operation(operation_id)
    return {"id": op.pk, "status": op.status, "done": op.done, "failed": op.failed, "total": op.total}


@shared_task(name="sluice.run_pipeline")
def run_pipeline(run_id: int | None = None, trigger: str = "beat", since: str | None = None) -> dict:
    """Export + Spark job + load (core.records.run): every SLUICE_PIPELINE_INTERVAL from beat,
    or now from the dashboard (``run_id``: the run row its progress shows in).  One at a
    time anywhere: the run takes the ``pipeline`` lease, and a run that finds it held is
    skipped, not queued.  ``since`` (ISO 8601, from the dashboard's action) recomputes the
    windows from that instant's hour."""
    from core.records.run import PipelineBusy, run_pipeline as run

    try:
        return run(dt.datetime.fromisoformat(since) if since else None, run_id=run_id, trigger=trigger).json()
    except PipelineBusy:
        log.info("pipeline run skipped: another run holds the lease")
        return {"skipped": 1}


@shared_task(name="sluice.evaluate_alerts")
def evaluate_alerts() -> dict:
    """One evaluation of the alert rules, for pools whose workers host no loops (beat runs it
    then): the evaluator's own lease keeps it to one at a time, released at once after."""
    from core.alerts.evaluator import AlertEvaluator

    evaluator = AlertEvaluator()
    try:
        evaluator.step()
    finally:
        evaluator.close()
    last = evaluator.last
    return {"skipped": 1} if last is None else {"rules": last.rules, "notifications": last.notifications}


@shared_task(name="sluice.sample_queues")
def sample_queues() -> dict:
    """One queue-length sample (the monitoring tab's history), for pools whose workers host no
    loops: the sampler's own lease keeps it to one writer at a time, released at once after."""
    from core.monitoring.queue_samples import QueueSampler  # like the tasks above: models load after the app registry

    sampler = QueueSampler()
    try:
        sampler.step()
    finally:
        sampler.close()
    return {"written": sampler.written}


@shared_task(name="sluice.record_ping")
def record_ping(message_id: str) -> None:
    """Write one demo business row (sluice_demo_ping): proves a task really ran, once per row."""
    from core.demo.models import PingRecord

    PingRecord.objects.create(message_id=message_id)
