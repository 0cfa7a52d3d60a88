"""Django tasks' finished results leave the database after SLUICE_TASK_RESULTS_RETENTION
(Celery beat's ``sluice.prune_task_results``, under a lease like the other clean-ups)."""
from __future__ import annotations

import datetime as dt
import time

from django.db.models.functions import Now

from core.conf import get_settings
from core.models import TaskResultRecord, TaskStatus


def prune_results(retention: float | None = None, batch_size: int = 1000, time_budget: float | None = None,
                  using: str | None = None) -> int:
    """Delete finished results older than SLUICE_TASK_RESULTS_RETENTION (by the database's
    clock), in batches of their own transactions.  READY results stay whatever their age:
    their task has yet to run.  Returns how many were deleted."""
    settings = get_settings()
    using = using or settings.DATABASE
    retention = settings.TASK_RESULTS_RETENTION if retention is None else retention
    budget_end = None if time_budget is None else time.monotonic() + time_budget
    old = TaskResultRecord.objects.using(using).filter(
        status__in=[TaskStatus.SUCCESSFUL, TaskStatus.FAILED],
        finished_at__lt=Now() - dt.timedelta(seconds=retention))
    total = 0
    while budget_end is None or time.monotonic() < budget_end:
        ids = list(old.order_by("finished_at").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        total += TaskResultRecord.objects.using(using).filter(pk__in=ids).delete()[0]
    return total
