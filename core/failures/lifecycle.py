"""A record's status after ingestion: resolved (its retry was handled), archived, restored,
deleted, and archived records purged after the retention."""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Callable, Iterable

from django.db import DatabaseError, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.conf import get_settings
from core.failures.records import FAILED_PURGE_BATCH_SIZE, MAX_IN, append_event, base, chunks, event, in_queue
from core.failures.selections import normalise, querysets
from core.models import FailedMessage, FailureStatus

log = logging.getLogger("sluice.failures")


def mark_resolved(message_id: str, using: str | None = None, queue: str | None = None) -> bool:
    """A retried message was handled (in ``queue``): its record is resolved.  Called by the
    pump inside the receive's transaction (so it commits with it).  False when there is no
    such record.  Records are per message id and queue: the same id may have failed in
    another queue, and that record stays as it is."""
    using = using or get_settings().DATABASE
    try:
        with transaction.atomic(using=using):  # a savepoint: bookkeeping must not undo the handler's work
            record = in_queue(base(using).select_for_update().filter(message_id=message_id), queue).first()
            if record is None or record.status == FailureStatus.RESOLVED:
                return False
            now = timezone.now()
            record.status = FailureStatus.RESOLVED
            record.resolved_at = now
            record.archived_at = None
            append_event(record, event("resolved", now, exception_type=record.exception_type,
                                       message="processed successfully after a retry"))
            record.save(using=using, update_fields=["status", "resolved_at", "archived_at", "history"])
            return True
    except DatabaseError:
        if not connections[using].is_usable():
            raise  # the receive cannot commit either
        log.exception("could not mark failed message %s resolved", message_id)
        return False


def archive_one(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None) -> None:
    record.status = FailureStatus.ARCHIVED
    record.archived_at = now
    append_event(record, event("archived", now, exception_type=record.exception_type, by=by, operation=operation))
    record.save(using=using, update_fields=["status", "archived_at", "history"])


def _in_batches(qs: QuerySet, using: str, batch: int, apply: Callable[[FailedMessage, dt.datetime], None]) -> int:
    """Apply ``apply(record, now)`` to the records of ``qs`` in batches, one transaction each."""
    count = 0
    last = 0
    while True:
        with transaction.atomic(using=using):
            records = list(qs.filter(pk__gt=last).order_by("pk").select_for_update()[:batch])
            now = timezone.now()
            for record in records:
                apply(record, now)
        count += len(records)
        if len(records) < batch:
            return count
        last = records[-1].pk


def archive(selection: Any, requested_by: str = "", using: str | None = None, batch: int = 1000) -> int:
    """Archive the unresolved records of ``selection`` (ids, a group, all); returns how many.
    For a large selection behind a progress bar use :func:`~core.failures.start_archive`."""
    using = using or get_settings().DATABASE
    return sum(_in_batches(qs, using, batch, lambda r, now: archive_one(r, now, requested_by, using, None))
               for qs in querysets(normalise(selection), (FailureStatus.UNRESOLVED,), using))


def restore_one(record: FailedMessage, now: dt.datetime, by: str, using: str) -> None:
    """One (locked) archived record back to unresolved."""
    record.status = FailureStatus.UNRESOLVED
    record.archived_at = None
    append_event(record, event("restored", now, exception_type=record.exception_type, by=by))
    record.save(using=using, update_fields=["status", "archived_at", "history"])


def restore(ids: Iterable[str] | Any, requested_by: str = "", using: str | None = None) -> int:
    """Archived → unresolved; returns how many were restored.  For a large selection behind a
    progress bar use :func:`~core.failures.start_restore`."""
    using = using or get_settings().DATABASE
    return sum(_in_batches(qs, using, 1000, lambda r, now: restore_one(r, now, requested_by, using))
               for qs in querysets(normalise(ids), (FailureStatus.ARCHIVED,), using))


def delete(ids: Iterable[str], using: str | None = None) -> int:
    """Remove records for good (any status); returns how many."""
    using = using or get_settings().DATABASE
    return sum(base(using).filter(message_id__in=chunk).delete()[0]
               for chunk in chunks([str(i) for i in ids], MAX_IN))


def purge_archived(older_than_seconds: float | None = None, batch: int = FAILED_PURGE_BATCH_SIZE,
                   using: str | None = None, include_resolved: bool = False) -> int:
    """Remove archived records archived more than ``older_than_seconds`` ago (and resolved ones
    resolved that long ago with ``include_resolved``), ``batch`` rows per transaction."""
    using = using or get_settings().DATABASE
    if older_than_seconds is None:
        older_than_seconds = get_settings().FAILED_ARCHIVE_RETENTION
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_seconds)
    old = Q(status=FailureStatus.ARCHIVED, archived_at__lt=cutoff)
    if include_resolved:
        old |= Q(status=FailureStatus.RESOLVED, resolved_at__lt=cutoff)
    total = 0
    while True:
        with transaction.atomic(using=using):
            pks = list(base(using).filter(old).order_by("pk").values_list("pk", flat=True)[:batch])
            if pks:
                base(using).filter(pk__in=pks).filter(old).delete()
        total += len(pks)
        if len(pks) < batch:
            break
    if total:
        log.info("purged %d archived failed message(s) older than %g s", total, older_than_seconds)
    return total


class ArchivedFailurePurger:
    """A loop (core.runtime.loops): removes archived failures past the retention period."""

    name = "failed-message-purge"

    def __init__(self, retention_seconds: float | None = None, interval: float | None = None,
                 using: str | None = None) -> None:
        self.retention = get_settings().FAILED_ARCHIVE_RETENTION if retention_seconds is None else retention_seconds
        self.interval = get_settings().ARCHIVE_PURGE_INTERVAL if interval is None else interval
        self.using = using or get_settings().DATABASE

    def step(self) -> float:
        purge_archived(self.retention, using=self.using)
        return self.interval

    def close(self) -> None:
        pass
