"""One pipeline run: export → Spark job → load the windows → retention, behind a lease.

`sluice pipeline run`, the Celery beat task and the dashboard's "run it now" button all
come here, and the lease (core.runtime.lease, ``pipeline``) lets one run at a time anywhere.
The run's stage and progress are kept in its ``PipelineRun`` row for the dashboard.

The job runs in this process's Spark driver: ``local[*]`` by default (an embedded JVM),
or a cluster (``SLUICE_SPARK_MASTER=spark://HOST:7077``, client mode: the executors must
reach ``SLUICE_RECORDS_PATH`` and ``SLUICE_METRICS_PATH``, e.g. on S3 or a shared file
system).  A Spark session already running in the process (tests share one) is used and
left running; one this run started is stopped afterwards, so a worker that runs the
pipeline hourly does not keep a JVM's memory between runs.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from core.conf import get_settings, spark_conf
from core.runtime.lease import Lease
from core.records.export import (LEASE, LEASE_SECONDS, WATERMARK, ExportResult, LeaseLost, export_records,
                                 still_held)
from core.records.extra import PipelineExtraMissing, require
from core.records.location import location
from core.models.records import ExportWatermark, PipelineRun, RunStatus
from core.records.results import load_path
from core.records.retention import delete_exported
from pipeline.job import hour_floor

log = logging.getLogger("sluice.pipeline")

__all__ = ["LEASE", "LEASE_SECONDS", "LeaseLost", "PipelineBusy", "RunResult", "last_run", "run_pipeline"]


class PipelineBusy(Exception):
    """Another run holds the lease."""


@dataclass
class RunResult:
    exported: int
    windows: int
    seconds: float
    spark_master: str
    run_id: int
    deleted: int = 0
    #: The hour the windows were recomputed from (None: nothing new, no job).
    since: dt.datetime | None = None
    held_back: int = 0
    held_reason: str = ""

    def json(self) -> dict[str, Any]:
        """The `pipeline run --json` line (a public format: extend, never rename)."""
        return {"exported": self.exported, "windows": self.windows, "seconds": round(self.seconds, 3),
                "spark_master": self.spark_master, "since": self.since.isoformat() if self.since else None,
                "held_back": self.held_back, "held_reason": self.held_reason, "deleted": self.deleted}


def _stage(run: PipelineRun, lease: Lease, stage: str, progress: int) -> None:
    """Renew the lease before each stage: a run that lost it stops before writing anything more."""
    if not still_held(lease):
        raise LeaseLost(f"lease {LEASE!r} lapsed before the {stage} stage: another run may hold it now")
    run.stage, run.progress = stage, progress
    run.save(update_fields=["stage", "progress"])
    log.info("pipeline run %s: %s", run.pk, stage)


def run_pipeline(since: dt.datetime | None = None, *, master: str | None = None, trigger: str = "cli",
                 run_id: int | None = None) -> RunResult:
    """Export new records, compute their windows (from ``since``'s hour, else from the hour
    of the earliest newly exported record), load them, apply the retention.

    Raises :class:`PipelineBusy` when another run holds the lease (the run row, if any, is
    marked skipped), :class:`PipelineExtraMissing` without pyspark or pyarrow (the run row,
    if one was queued, is marked failed with that message: the charts page stops waiting)."""
    settings = get_settings()
    using = settings.DATABASE
    master = master or settings.SPARK_MASTER
    if run_id is None:
        require("pyspark", "pyarrow")  # before a run row: the CLI says it and leaves nothing behind
    run = (PipelineRun.objects.using(using).get(pk=run_id) if run_id is not None
           else PipelineRun.objects.using(using).create(trigger=trigger))
    try:
        require("pyspark", "pyarrow")
    except PipelineExtraMissing as exc:
        run.status, run.error, run.finished_at = RunStatus.FAILED, str(exc), timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
        raise
    lease = Lease(LEASE, LEASE_SECONDS, using)
    if not lease.acquire():
        run.status, run.finished_at = RunStatus.SKIPPED, timezone.now()
        run.save(update_fields=["status", "finished_at"])
        raise PipelineBusy("another pipeline run is in progress (lease 'pipeline' held)")
    started = time.monotonic()
    run.status, run.started_at, run.spark_master = RunStatus.RUNNING, timezone.now(), master
    run.save(update_fields=["status", "started_at", "spark_master"])
    try:
        _stage(run, lease, "export", 5)
        exported = export_records(using=using, lease=lease)
        run.exported = exported.exported
        start = _start(since, using)
        windows = 0
        if start is not None:
            run.since = start
            _stage(run, lease, "job", 30)
            output = location(settings.METRICS_PATH).spark_uri
            master = _spark_job(master, location(settings.RECORDS_PATH).spark_uri, output, run.since,
                                settings.SPARK_DRIVER_MEMORY, spark_conf(settings.SPARK_CONF))
            run.spark_master = master
            _stage(run, lease, "load", 80)
            windows = load_path(settings.METRICS_PATH, run.since, using)
            _loaded(start, using)
        _stage(run, lease, "retention", 95)
        run.deleted = delete_exported(using)
        run.windows, run.seconds = windows, time.monotonic() - started
        run.status, run.stage, run.progress, run.finished_at = RunStatus.SUCCEEDED, "done", 100, timezone.now()
        run.save()
        _log_held(exported)
        return RunResult(run.exported, windows, run.seconds, master, run.pk, run.deleted, run.since,
                         exported.held_back, exported.held_reason)
    except BaseException as exc:
        run.status, run.error, run.finished_at = RunStatus.FAILED, f"{type(exc).__name__}: {exc}", timezone.now()
        run.seconds = time.monotonic() - started
        run.save()
        raise
    finally:
        lease.release()


def _start(since: dt.datetime | None, using: str) -> dt.datetime | None:
    """Where the windows must be recomputed from: the earliest of ``since`` and every record
    exported but not loaded yet (by this run, a failed one, or `records export`), as an hour."""
    row = ExportWatermark.objects.using(using).filter(name=WATERMARK).first()
    pending = row.pending_since_us if row else None
    starts = [hour_floor(since)] if since is not None else []
    if pending is not None:
        starts.append(hour_floor(dt.datetime.fromtimestamp(pending / 1e6, dt.timezone.utc)))
    return min(starts) if starts else None


def _loaded(start: dt.datetime, using: str) -> None:
    """The windows from ``start`` on are loaded: nothing exported before this run is pending
    any more (the lease keeps exports out meanwhile)."""
    ExportWatermark.objects.using(using).filter(
        name=WATERMARK, pending_since_us__gte=int(start.timestamp() * 1_000_000)).update(pending_since_us=None)


def _log_held(exported: ExportResult) -> None:
    if exported.held_back:
        log.info("records export: %s", exported.held_reason)


def _spark_job(master: str, records: str, output: str, since: dt.datetime, driver_memory: str,
               conf: dict[str, str]) -> str:
    """Run the job; returns the master it ran on (a session already running keeps its own)."""
    from pyspark import SparkContext

    from pipeline import job

    ours = SparkContext._active_spark_context is None  # else: a session this process already runs
    spark = job.session(master, driver_memory=driver_memory, extra=conf)
    try:
        job.run(spark, records, output, since)
        return spark.sparkContext.master
    finally:
        if ours:
            spark.stop()


def last_run(using: str | None = None) -> PipelineRun | None:
    """The newest run that finished or is under way (not a skipped one)."""
    using = using or get_settings().DATABASE
    return (PipelineRun.objects.using(using).exclude(status=RunStatus.SKIPPED).order_by("-id").first())
