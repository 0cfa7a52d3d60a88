"""Periodic and operator-requested tasks.  Each periodic task takes a lease first, so it
never runs twice at once across workers, and works within a time budget."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from celery import shared_task

from core.conf import get_settings
from core.lease import Lease

log = logging.getLogger("sluice.tasks")


@contextmanager
def exclusive(name: str) -> Iterator[bool]:
    """True when this worker got the job; the lease outlives a stuck run by a margin."""
    settings = get_settings()
    lease = Lease(f"task:{name}", settings.TASK_TIME_BUDGET * 3, settings.DATABASE)
    got = lease.acquire()
    try:
        yield got
    finally:
        if got:
            lease.release()


@shared_task(name="sluice.purge_expired")
def purge_expired() -> dict:
    from core.expiry import purge_expired_messages

    with exclusive("purge_expired") as mine:
        return purge_expired_messages(time_budget=get_settings().TASK_TIME_BUDGET) if mine else {"skipped": 1}


@shared_task(name="sluice.delete_idle_queues")
def delete_idle_queues() -> list:
    from core.expiry import delete_idle_queues as run

    with exclusive("delete_idle_queues") as mine:
        return run() if mine else []
