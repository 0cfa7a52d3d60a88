"""Running the analytics pipeline now (export + Spark job + load) as a Celery task."""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from core.models.records import PipelineRun, RunStatus

from dashboard.actions.audit import acting
from dashboard.actions.errors import ActionError
from dashboard.actions.operations import PIPELINE_TASK, BrokerUnavailable, send
from dashboard.actions.result import ActionResult


def run_pipeline(user: Any, since: dt.datetime | None = None, *, via: str = "") -> ActionResult:
    """Queue a pipeline run; its PipelineRun row (``run_id``) carries the progress the charts
    page polls.  The worker's lease keeps two runs from overlapping, so a second request
    while one runs is recorded as skipped rather than refused here (a queued run nobody
    picks up must not block the button for ever).  Broker down → the row is marked failed
    and ActionError 503."""
    with acting(user, "run_pipeline", via, target="analytics pipeline") as audit:
        if since is not None and since.tzinfo is None:
            raise ActionError("since must carry a time zone (an ISO 8601 instant such as 2026-11-23T10:00Z)")
        run = PipelineRun.objects.create(status=RunStatus.QUEUED,
                                         trigger=f"{'api' if via == 'api' else 'dashboard'}:{user.get_username()}")
        audit.target, audit.ids = f"pipeline run {run.pk}", [str(run.pk)]
        audit.detail = f"since {since.isoformat()}" if since else "new records"
        try:
            send(PIPELINE_TASK, kwargs={"run_id": run.pk, "trigger": run.trigger,
                                        "since": since.isoformat() if since else None})
        except BrokerUnavailable as exc:
            run.status, run.error, run.finished_at = RunStatus.FAILED, f"could not queue the task: {exc}", timezone.now()
            run.save(update_fields=["status", "error", "finished_at"])
            raise ActionError(f"The pipeline could not be started: {exc}", 503) from exc
    return ActionResult("run_pipeline", 1, f"pipeline run {run.pk} queued", audit_id=audit.entry_id, run_id=run.pk)
