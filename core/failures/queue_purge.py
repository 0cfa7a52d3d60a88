"""A queue's purge as a :class:`~core.models.BulkOperation` of kind "purge", run by a worker
(``sluice.run_bulk_operation``) in batches of SLUICE_PURGE_BATCH_SIZE rows, one transaction
each, its ``done`` counter updated after every batch so a page shows a progress bar.

A purge of a million rows takes longer than a proxy waits for a request; run here, the
request only queues it.  One purge per queue at a time (:func:`active_operation`): a second
click finds the first under way instead of starting another.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

from django.db.models import F
from django.utils import timezone

from core.conf import get_settings
from core.models import BulkOperation, BulkOperationStatus
from core.transport import MAX_PURGE_BATCH, Transport

log = logging.getLogger("sluice.failures")

ACTIVE = (BulkOperationStatus.PENDING, BulkOperationStatus.RUNNING)
#: Active operations looked at for a duplicate (there are only ever a few).
ACTIVE_SCAN = 100


def _same(selection: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Selections equal but for the snapshot bound a job adds when it starts ("upto")."""
    return {k: v for k, v in selection.items() if k != "upto"} == {k: v for k, v in other.items() if k != "upto"}


def active_operation(kind: str, selection: Mapping[str, Any], using: str | None = None) -> BulkOperation | None:
    """A pending or running operation of ``kind`` over the same selection, if there is one."""
    using = using or get_settings().DATABASE
    ops = BulkOperation.objects.using(using).filter(kind=kind, status__in=ACTIVE).order_by("pk")[:ACTIVE_SCAN]
    return next((op for op in ops if _same(op.selection, selection)), None)


def start_purge(queue: str, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create a pending purge of ``queue``; its total is the queue's estimated size (max − min
    RowVersion: counting a big table in the request is what this avoids)."""
    using = using or get_settings().DATABASE
    estimate = Transport(using).peek_estimate(queue)
    return BulkOperation.objects.using(using).create(
        kind="purge", selection={"queue": queue}, description=f"purge of queue {queue}"[:500], total=estimate,
        requested_by=(requested_by or "")[:150])


def run_purge(op: BulkOperation, using: str, batch_size: int | None = None) -> BulkOperation:
    """Delete the queue's rows in batches until one comes back short (rows receivers hold are
    skipped, as :meth:`Transport.purge` does); the total becomes what was deleted."""
    ops = BulkOperation.objects.using(using)
    queue = op.selection["queue"]
    size = min(batch_size or get_settings().PURGE_BATCH_SIZE, MAX_PURGE_BATCH)
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.RUNNING, updated_at=timezone.now())
    transport = Transport(using)
    try:
        while True:
            deleted = transport.purge(queue, batch_size=size, max_batches=1)
            if deleted:
                ops.filter(pk=op.pk).update(done=F("done") + deleted, updated_at=timezone.now())
            if deleted < size:
                break
    except Exception as exc:
        ops.filter(pk=op.pk).update(status=BulkOperationStatus.FAILED, finished_at=timezone.now(),
                                    error=f"stopped: {type(exc).__name__}: {exc}")
        log.exception("purge operation %s of queue %s stopped", op.pk, queue)
        raise
    op.refresh_from_db(using=using)
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.FINISHED, finished_at=timezone.now(), total=op.done)
    op.refresh_from_db(using=using)
    log.info("purge operation %s of queue %s finished: %d deleted", op.pk, queue, op.done)
    return op
