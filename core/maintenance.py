"""The periodic clean-ups, as jobs: purge expired messages, delete idle temporary queues,
ingest the error queue, purge archived failures, clean up the outbox, prune Django tasks'
finished results.

One definition serves both ways of running them: Celery beat schedules each as a task
(workers/tasks.py calls :func:`run_job`), and a worker without beat (``sluice worker``)
runs them all in one :class:`MaintenanceLoop`.  Either way a run takes the job's lease
first (``task:<name>``, in the database), so two processes never run the same job at once,
and a worker and beat side by side share the work instead of doubling it.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from core.conf import get_settings
from core.expiry import delete_idle_queues, purge_expired_messages
from core.failures import ingest_errors, purge_archived
from core.models import TaskResultRecord
from core.outbox import Outbox, OutboxStore
from core.runtime.lease import Lease
from core.tasks.retention import prune_results

log = logging.getLogger("sluice.maintenance")


@dataclass(frozen=True)
class Job:
    name: str
    #: The SLUICE_* setting of its interval (seconds; 0 or less: the job is off).
    interval_setting: str
    run: Callable[[], Any]
    #: What it returns when another process holds the lease.
    skipped: Any = 0


def _prune_task_results() -> int:
    if not TaskResultRecord.objects.exists():  # no tasks here: no lease round trips either
        return 0
    return prune_results(time_budget=get_settings().TASK_TIME_BUDGET)


def _outbox_cleanup() -> int:
    if get_settings().OUTBOX_CLEANUP_INTERVAL <= 0 or not OutboxStore().exists():  # 0 or less: off
        return 0
    return Outbox().cleanup()


JOBS = {job.name: job for job in (
    Job("purge_expired", "PURGE_INTERVAL",
        lambda: purge_expired_messages(time_budget=get_settings().TASK_TIME_BUDGET), {"skipped": 1}),
    Job("delete_idle_queues", "IDLE_QUEUE_INTERVAL", delete_idle_queues, []),
    Job("ingest_errors", "INGEST_INTERVAL", lambda: ingest_errors(max_batches=50)),
    Job("purge_archived_failures", "ARCHIVE_PURGE_INTERVAL", purge_archived),
    Job("outbox_cleanup", "OUTBOX_CLEANUP_INTERVAL", _outbox_cleanup),
    Job("prune_task_results", "TASK_RESULTS_PRUNE_INTERVAL", _prune_task_results),
)}


@contextmanager
def exclusive(name: str) -> Iterator[bool]:
    """True when this process got the job; the lease outlives a stuck run by a margin."""
    settings = get_settings()
    lease = Lease(f"task:{name}", settings.TASK_TIME_BUDGET * 3, settings.DATABASE)
    got = lease.acquire()
    try:
        yield got
    finally:
        if got:
            lease.release()


def run_job(name: str) -> Any:
    """One run of job ``name`` under its lease (the job's ``skipped`` value if it is held)."""
    job = JOBS[name]
    with exclusive(name) as mine:
        return job.run() if mine else job.skipped


#: What a worker without beat runs here: the outbox's clean-up has a loop of its own among
#: the outbox loops every worker hosts (core.outbox.worker_loops).
WORKER_JOBS = ("purge_expired", "delete_idle_queues", "ingest_errors", "purge_archived_failures",
               "prune_task_results")


class MaintenanceLoop:
    """Every job at its interval, for a worker that runs without Celery beat.  A step runs
    the jobs that are due (each under its lease) and waits until the next one is."""

    name = "maintenance"

    def __init__(self, jobs: tuple[str, ...] | list[str] = WORKER_JOBS) -> None:
        self.jobs = list(jobs)
        self._due = {name: 0.0 for name in self.jobs}  # monotonic: each runs at the first step

    def _interval(self, name: str) -> float:
        return getattr(get_settings(), JOBS[name].interval_setting)

    def step(self) -> float:
        now = time.monotonic()
        for name in self.jobs:
            interval = self._interval(name)
            if interval <= 0 or self._due[name] > now:
                continue
            self._due[name] = now + interval
            result = run_job(name)
            if result and result != JOBS[name].skipped:
                log.info("maintenance %s: %s", name, result)
        waits = [self._due[name] - time.monotonic() for name in self.jobs if self._interval(name) > 0]
        return max(0.05, min(waits, default=60.0))

    def close(self) -> None:
        pass
