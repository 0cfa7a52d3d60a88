"""How many failed-message records there are by status, and unresolved ones by queue, for the
statistics snapshot (dashboard/counting/stats.py): read in one statement from the counts the
database keeps per status and queue (core.models.FailedQueueCount, kept by triggers:
core/dialects/failed_counts_sql.py), so they are exact however many records there are.
Counting the records themselves, even up to a cap per queue with the planner's estimate
beyond it, took most of a snapshot's time at a million records.

Records whose queue carries an endpoint's ``@machine`` suffix count under their status but
under no queue (their count row is "name@machine", which no queue is called)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.models import FailedQueueCount, FailureStatus


@dataclass
class FailedCounts:
    #: Every status, 0 when none.
    by_status: dict[str, int] = field(default_factory=dict)
    #: Unresolved records by queue name (every name asked about).
    by_queue: dict[str, int] = field(default_factory=dict)


def count_failed(using: str, queues: list[str]) -> FailedCounts:
    """Counts for every status and for each of ``queues`` (their unresolved records); raises
    the database's error."""
    by_status = {status: 0 for status in FailureStatus.values}
    unresolved: dict[str, int] = {}
    for status, queue, records in (FailedQueueCount.objects.using(using).filter(records__gt=0)
                                   .values_list("status", "queue", "records")):
        by_status[status] = by_status.get(status, 0) + records
        if status == FailureStatus.UNRESOLVED:
            unresolved[queue] = records
    return FailedCounts(by_status, {name: unresolved.get(name, 0) for name in queues})
