"""Starting work on the workers: bulk operations and pipeline runs.

The dashboard must not import ``workers`` (import-linter), so it sends the task by name
through a small Celery producer of its own, on the broker the workers use (REDIS_URL)
and to their queue.  When the broker cannot be reached the operation is marked failed
and the action says so (503): an operation is never left pending with nobody to run it.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from core.conf import get_settings
from django.utils import timezone

from core.models import BulkOperation, BulkOperationStatus

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("sluice.dashboard")

#: The task (workers/tasks.py) and the queue the workers consume (workers/celery.py
#: ``task_default_queue``; tests/test_dashboard_actions.py checks they agree).
BULK_TASK = "sluice.run_bulk_operation"
#: The analytics pipeline's task (workers/tasks.py ``run_pipeline``).
PIPELINE_TASK = "sluice.run_pipeline"
TASK_QUEUE = "sluice"
#: Seconds to reach the broker before the operation is given up as failed.
BROKER_TIMEOUT = 2.0

_lock = threading.Lock()
_producers: dict[str, "Celery"] = {}


class BrokerUnavailable(Exception):
    """The task could not be handed to the broker."""


def producer(broker_url: str | None = None) -> "Celery":
    """A Celery app that only sends tasks (one per broker URL, per process)."""
    # Celery (and kombu) are imported on the first send, not with this module: every process
    # that loads Django's admin imports the actions, and a queue worker would carry 60
    # modules of Celery it never uses.
    from celery import Celery

    url = broker_url or get_settings().REDIS_URL
    with _lock:
        app = _producers.get(url)
        if app is None:
            app = Celery("sluice-dashboard", set_as_current=False)
            app.conf.update(
                broker_url=url, task_default_queue=TASK_QUEUE, broker_connection_retry=False,
                broker_connection_retry_on_startup=False, broker_connection_max_retries=0,
                broker_connection_timeout=BROKER_TIMEOUT,
                broker_transport_options={"socket_connect_timeout": BROKER_TIMEOUT,
                                          "socket_timeout": BROKER_TIMEOUT, "max_retries": 0},
            )
            _producers[url] = app
        return app


def send(task: str, *, args: list | None = None, kwargs: dict | None = None) -> None:
    """Hand one task, by name, to the workers' queue: the one way the dashboard sends a task.
    BrokerUnavailable (with the reason) when the broker cannot take it."""
    try:
        producer().send_task(task, args=args, kwargs=kwargs, queue=TASK_QUEUE, retry=False)
    except Exception as exc:  # noqa: BLE001 — kombu/redis raise many kinds; all mean "not queued"
        raise BrokerUnavailable(f"the task broker (Redis) is unreachable ({exc})") from exc


def enqueue(operation: BulkOperation) -> None:
    """Hand ``operation`` to the workers.  On failure it is marked failed (with the reason)
    and BrokerUnavailable is raised."""
    try:
        send(BULK_TASK, args=[operation.pk])
    except BrokerUnavailable as exc:
        reason = f"could not queue the operation: {exc}"
        BulkOperation.objects.filter(pk=operation.pk).update(
            status=BulkOperationStatus.FAILED, error=reason, finished_at=timezone.now())
        log.error("bulk operation %s not queued: %s", operation.pk, exc)
        raise BrokerUnavailable(reason) from exc
