"""Bulk retry, archive and restore (and a queue's purge) as :class:`~core.models.BulkOperation` jobs.

Records are handled in batches, one transaction each, and the operation's counters are
updated per batch so a page can poll them (``sluice.run_bulk_operation`` runs one in
Celery; the CLI runs it in place with a progress bar).
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from django.db import DatabaseError, transaction
from django.db.models import F, Max, QuerySet
from django.utils import timezone

from core.conf import get_settings
from core.failures.lifecycle import archive_one, restore_one
from core.failures.queue_purge import run_purge
from core.failures.records import MAX_ERROR_LINES, MAX_IN, RetryRefused, base, chunks
from core.failures.retrying import send_back
from core.failures.selections import describe, eligible, matching, normalise, querysets, with_ids
from core.models import BulkOperation, BulkOperationStatus

log = logging.getLogger("sluice.failures")

#: Kinds over failed-message records; "purge" (a queue's rows) runs in core.failures.queue_purge.
KINDS = ("retry", "archive", "restore")


def _start(kind: str, selection: Any, requested_by: str, using: str | None) -> BulkOperation:
    using = using or get_settings().DATABASE
    sel = normalise(selection)
    if "ids" not in sel:
        # Snapshot: records that fail for the first time after this are not part of the job.
        sel["upto"] = base(using).aggregate(m=Max("pk"))["m"] or 0
    total = sum(qs.count() for qs in querysets(sel, eligible(kind, sel), using))
    return BulkOperation.objects.using(using).create(
        kind=kind, selection=sel, description=describe(sel, using)[:500], total=total,
        requested_by=(requested_by or "")[:150])


def retry(selection: Any, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create a retry operation (pending) for ``selection``; run it with :func:`run_operation`
    (a Celery task in production, directly in tests and the CLI)."""
    return _start("retry", selection, requested_by, using)


def start_archive(selection: Any, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create an archive operation (pending) for a large selection; run it with :func:`run_operation`."""
    return _start("archive", selection, requested_by, using)


def start_restore(selection: Any, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create a restore operation (archived → unresolved, pending); run it with :func:`run_operation`."""
    return _start("restore", selection, requested_by, using)


def _batches(op: BulkOperation, batch_size: int, using: str) -> Iterator[QuerySet]:
    """Querysets of the records of each batch (evaluated inside the batch's transaction)."""
    sel = op.selection
    statuses = eligible(op.kind, sel)
    if "ids" in sel:
        for chunk in chunks(sel["ids"], min(batch_size, MAX_IN)):
            yield with_ids(chunk, statuses, using).order_by("pk")
        return
    last = 0
    while True:
        pks = list(matching(sel, statuses, using).filter(pk__gt=last).order_by("pk")
                   .values_list("pk", flat=True)[:batch_size])
        if not pks:
            return
        last = pks[-1]
        # Re-checked under the lock: the status may have changed since.
        yield matching(sel, statuses, using).filter(pk__in=pks).order_by("pk")
        if len(pks) < batch_size:
            return


def run_operation(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run a pending (or interrupted) retry / archive operation in batches, one transaction
    each, updating its counters after every batch.  Safe to run again after a crash: records
    already done have left the selection's statuses."""
    using = using or get_settings().DATABASE
    batch_size = batch_size or get_settings().RETRY_BATCH_SIZE
    ops = BulkOperation.objects.using(using)
    op = ops.get(pk=operation_id)
    if op.status in (BulkOperationStatus.FINISHED, BulkOperationStatus.FAILED):
        return op
    if op.kind == "purge":
        return run_purge(op, using)
    if op.kind not in KINDS:
        raise ValueError(f"unknown operation kind {op.kind!r}")
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.RUNNING, updated_at=timezone.now())
    reasons = [line for line in op.error.splitlines() if line]
    try:
        for qs in _batches(op, batch_size, using):
            with transaction.atomic(using=using):
                done, failed = _run_batch(op, list(qs.select_for_update()), reasons, using)
                if done or failed:
                    ops.filter(pk=op.pk).update(done=F("done") + done, failed=F("failed") + failed,
                                                error="\n".join(reasons), updated_at=timezone.now())
    except Exception as exc:
        ops.filter(pk=op.pk).update(status=BulkOperationStatus.FAILED, finished_at=timezone.now(),
                                    error="\n".join([*reasons, f"stopped: {type(exc).__name__}: {exc}"]))
        log.exception("%s operation %s stopped", op.kind, op.pk)
        raise
    op.refresh_from_db(using=using)
    # Records that left the selection meanwhile (retried, deleted…) are not counted.
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.FINISHED, finished_at=timezone.now(),
                                total=min(op.total, op.done + op.failed) if op.total else op.done + op.failed)
    op.refresh_from_db(using=using)
    log.info("%s operation %s (%s) finished: %d done, %d failed", op.kind, op.pk, op.description, op.done,
             op.failed)
    return op


def _run_batch(op: BulkOperation, records: list, reasons: list[str], using: str) -> tuple[int, int]:
    """Archive or retry the (locked) records of one batch; (done, failed)."""
    done = failed = 0
    now = timezone.now()
    for record in records:
        if op.kind in ("archive", "restore"):
            if op.kind == "archive":
                archive_one(record, now, op.requested_by, using, op.pk)
            else:
                restore_one(record, now, op.requested_by, using)
            done += 1
            continue
        try:
            with transaction.atomic(using=using):  # a savepoint: a failed insert undoes only itself
                send_back(record, now, op.requested_by, using, op.pk)
            done += 1
        except (RetryRefused, DatabaseError) as exc:
            failed += 1
            if len(reasons) < MAX_ERROR_LINES:
                reasons.append(f"{record.message_id}: {exc}")
            log.warning("retry of failed message %s refused: %s", record.message_id, exc)
    return done, failed


def run_retry(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run a retry operation made by :func:`retry`."""
    return run_operation(operation_id, batch_size, using)


def run_archive(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run an archive operation made by :func:`start_archive`."""
    return run_operation(operation_id, batch_size, using)
