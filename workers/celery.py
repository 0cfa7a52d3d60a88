"""The Celery app: Redis broker (REDIS_URL), Sluice's loops in a worker bootstep, and the
beat schedule of the periodic maintenance tasks (intervals from SLUICE_* settings).

    celery -A workers worker --pool=threads -c 2     # pumps + mover + tasks
    celery -A workers beat                           # the schedule
"""
from __future__ import annotations

import logging
import os
import threading

import django
from celery import Celery, bootsteps, platforms, signals
from django.apps import apps

from sluice.project import ProjectNotFound, use_project

# Set up once: a running Django process that publishes outbox tasks has done it already.
if not apps.ready:
    # The project you run in (DJANGO_SETTINGS_MODULE, else the manage.py here), never Sluice's
    # bundled demo project by surprise: the choice is logged once the logging is set up.
    try:
        _settings_module, _settings_source = use_project()
    except ProjectNotFound as exc:
        raise SystemExit(f"celery -A workers: {exc}") from None
    django.setup()
else:
    _settings_module, _settings_source = os.environ.get("DJANGO_SETTINGS_MODULE", "?"), "the running process"

from core.conf import get_settings  # noqa: E402
from core.startup import refuse_to_start_insecurely, settle_heap  # noqa: E402
from sluice.logs import JsonFormatter  # noqa: E402

log = logging.getLogger("sluice.celery")
conf = get_settings()


@signals.celeryd_after_setup.connect
def say_which_settings(sender: str, instance, **kwargs) -> None:
    """Once Celery's logging is set up: which project this worker runs in (a worker that
    quietly ran another project's settings would be hard to spot)."""
    log.info("Django settings: %s (from %s)", _settings_module, _settings_source)


def beat_schedule() -> dict:
    """The periodic tasks, every interval a SLUICE_* setting.  A run that waited past its
    interval is dropped (``expires``): the next one does the same work."""
    conf = get_settings()  # at call time: tests change settings after import
    schedule = {
        "purge-expired": {"task": "sluice.purge_expired", "schedule": conf.PURGE_INTERVAL,
                          "options": {"expires": conf.PURGE_INTERVAL}},
        "delete-idle-queues": {"task": "sluice.delete_idle_queues", "schedule": conf.IDLE_QUEUE_INTERVAL,
                               "options": {"expires": conf.IDLE_QUEUE_INTERVAL}},
        "ingest-errors": {"task": "sluice.ingest_errors", "schedule": conf.INGEST_INTERVAL,
                          "options": {"expires": conf.INGEST_INTERVAL}},
        "purge-archived-failures": {"task": "sluice.purge_archived_failures",
                                    "schedule": conf.ARCHIVE_PURGE_INTERVAL,
                                    "options": {"expires": conf.ARCHIVE_PURGE_INTERVAL}},
        "prune-task-results": {"task": "sluice.prune_task_results", "schedule": conf.TASK_RESULTS_PRUNE_INTERVAL,
                               "options": {"expires": conf.TASK_RESULTS_PRUNE_INTERVAL}},
    }
    # Export + Spark job + load; the run itself takes the "pipeline" lease (core.records.run).
    # SLUICE_PIPELINE_SCHEDULE=0: not scheduled (run on a cluster, or no Java here).
    if conf.PIPELINE_SCHEDULE:
        schedule["analytics-pipeline"] = {"task": "sluice.run_pipeline", "schedule": conf.PIPELINE_INTERVAL,
                                          "options": {"expires": conf.PIPELINE_INTERVAL}}
    if conf.ALERTS_ENABLED and not conf.CELERY_HOST_LOOPS:  # else every worker's loops host the evaluator
        schedule["evaluate-alerts"] = {"task": "sluice.evaluate_alerts", "schedule": conf.ALERTS_INTERVAL,
                                       "options": {"expires": conf.ALERTS_INTERVAL}}
    if not conf.CELERY_HOST_LOOPS:  # else the workers' loops sample queue lengths
        schedule["sample-queues"] = {"task": "sluice.sample_queues", "schedule": conf.MONITORING_SAMPLE_INTERVAL,
                                     "options": {"expires": conf.MONITORING_SAMPLE_INTERVAL}}
    if conf.OUTBOX_CLEANUP_INTERVAL > 0:  # 0 or less disables the clean-up
        schedule["outbox-cleanup"] = {"task": "sluice.outbox_cleanup", "schedule": conf.OUTBOX_CLEANUP_INTERVAL,
                                      "options": {"expires": conf.OUTBOX_CLEANUP_INTERVAL}}
    return schedule


# The result backend's module, imported before any thread starts: Celery imports it when first
# used, and beat's shutdown once did so while its service thread was doing the same; one of
# them met the module half made (AttributeError: no RedisBackend) and beat exited with 1.
import celery.backends.redis  # noqa: E402,F401

app = Celery("sluice")
app.conf.update(
    broker_url=get_settings().REDIS_URL,
    result_backend=get_settings().REDIS_URL,
    broker_connection_retry_on_startup=True,
    # A task a dying worker had taken is given to another one, not lost.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    timezone="UTC",
    task_default_queue="sluice",
    beat_schedule=beat_schedule(),
)


class SluiceLoops(bootsteps.StartStopStep):
    """Hosts core's long-running loops (pumps, delayed mover, outbox dispatcher, health) in
    the worker process: they start with the worker and stop with it, finishing in-flight
    batches."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self.host = None

    def start(self, worker) -> None:
        if not get_settings().CELERY_HOST_LOOPS:
            log.info("SLUICE_CELERY_HOST_LOOPS is off: this worker runs tasks only")
            return
        from core.worker import WorkerHost

        # Outbox clean-up runs from beat here (one worker at a time), not in every worker.
        self.host = WorkerHost(demo_traffic=get_settings().DEMO_TRAFFIC, redis_url=get_settings().REDIS_URL,
                               outbox_cleanup=False).start()
        log.info("Sluice loops started: %s", ", ".join(loop.name for loop in self.host.runner.loops))

    def stop(self, worker) -> None:
        if self.host is not None:
            stopped = self.host.stop()
            for line in self.host.summary():
                log.info(line)
            log.info("Sluice loops stopped%s", "" if stopped else " (some did not finish in time)")
            self.host = None


app.steps["worker"].add(SluiceLoops)


# At start-up of a worker or beat, not at import: a web process imports this module to
# publish outbox tasks, and is checked by its own server (core/startup.py).
@signals.celeryd_init.connect
def refuse_insecure_worker(**kwargs) -> None:
    refuse_to_start_insecurely("the Celery worker")


@signals.worker_init.connect
def settle_worker_heap(**kwargs) -> None:
    """Before the pool's processes fork (core.startup.settle_heap): no full-collection
    pauses over start-up's objects in the pumps' latency, and fewer pages copied on write."""
    settle_heap()


@signals.beat_init.connect
def refuse_insecure_beat(**kwargs) -> None:
    refuse_to_start_insecurely("Celery beat")


@signals.beat_init.connect
def stop_beat_by_unwinding(sender, **kwargs) -> None:
    """SIGTERM and SIGINT stop beat by unwinding its loop; the loop's own ``finally`` then
    saves and closes the schedule, with nothing half done.

    Celery's handler closes the schedule and the broker connection inside the signal
    handler and only then raises SystemExit.  When the signal lands while a task is being
    published, the half-read Redis reply fails on the closed socket, that error replaces
    SystemExit, and beat ticks on over a closed schedule until it crashes: exit code 1 and
    a CRITICAL log, for about one in 25 stops timed just after a send began (every deploy
    stops beat; tests/test_celery_beat.py lands the signal there every time).
    ``sender`` is beat's Service, whose ``start`` has installed Celery's handler already."""
    if threading.current_thread() is not threading.main_thread():
        return  # a beat embedded in a worker's thread: signals are the worker's

    def stop(signum, frame) -> None:
        sender.stop()  # the loop stops even if something up the stack swallowed SystemExit
        raise SystemExit()

    platforms.signals.update(SIGTERM=stop, SIGINT=stop)


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def json_log_lines(logger, **kwargs) -> None:
    """SLUICE_LOG_FORMAT=json: Celery's own handlers (it takes over the root logger) write
    JSON lines like Django's and gunicorn's."""
    if get_settings().LOG_FORMAT == "json":
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())
app.autodiscover_tasks(["workers"], related_name="tasks", force=True)
