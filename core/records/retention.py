"""Exported records leave the database after ``SLUICE_RECORDS_RETENTION``, in batches.

Only records at or below the export watermark are deleted: a record that is not in the
data set yet stays, however old.  Each batch is one short DELETE over an id range (a
few thousand rows: SQL Server escalates to a table lock at about 5,000), so the pumps
writing new records are never held up for long.
"""
from __future__ import annotations

from django.db import transaction

from core.conf import MAX_OUTBOX_CLEANUP_BATCH, get_settings
from core.records.export import watermark
from core.models.records import ProcessingRecord
from core.records.writer import now_us

BATCH = MAX_OUTBOX_CLEANUP_BATCH


def delete_exported(using: str | None = None, retention: float | None = None, batch: int = BATCH) -> int:
    """Delete exported records that ended more than ``retention`` seconds ago; returns how many."""
    settings = get_settings()
    using = using or settings.DATABASE
    retention = settings.RECORDS_RETENTION if retention is None else retention
    cutoff = now_us() - int(retention * 1_000_000)
    old = ProcessingRecord.objects.using(using).filter(id__lte=watermark(using), ended_us__lt=cutoff)
    deleted = 0
    while True:
        upper = old.order_by("id").values_list("id", flat=True)[batch - 1:batch].first()
        with transaction.atomic(using=using):
            count, _ = (old.filter(id__lte=upper) if upper is not None else old).delete()
        deleted += count
        if upper is None or not count:
            return deleted
