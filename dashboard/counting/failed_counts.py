"""How many failed-message records there are by status, and unresolved ones by queue, for the
statistics snapshot (dashboard/counting/stats.py), without grouping every record.

Each count is an index lookup that stops at ``SLUICE_DASHBOARD_EXACT_COUNT_LIMIT`` + 1 rows
(dialect ``failed_counts``: one statement for the statuses and a few hundred queues).  A
count past the cap is replaced by the planner's estimate where the database has one
(PostgreSQL, shown "≈"), else kept as a lower bound (shown "N+"): grouping a million
records by status and queue took most of a snapshot's time, and more with every record kept.

Records whose queue carries an endpoint's ``@machine`` suffix count under their status but
under no queue: no index finds "name@…" without a scan on every database."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.models import FailedMessage, FailureStatus

#: Queue names per statement (four parameters each; SQL Server takes 2,100 in all).
QUEUES_PER_STATEMENT = 200


@dataclass
class Count:
    value: int
    #: Above the cap: ``value`` is the planner's estimate ("≈").
    estimated: bool = False
    #: Above the cap and no estimate: ``value`` is a lower bound ("+").
    capped: bool = False


@dataclass
class FailedCounts:
    #: Every status, 0 when none.
    by_status: dict[str, Count] = field(default_factory=dict)
    #: Unresolved records by queue name (every name asked about).
    by_queue: dict[str, Count] = field(default_factory=dict)


def count_failed(cursor: Any, dialect: Any, queues: list[str], cap: int) -> FailedCounts:
    """Counts for every status and for each of ``queues`` (their unresolved records) through
    ``cursor``; raises the database's error."""
    table = FailedMessage._meta.db_table
    statuses = list(FailureStatus.values)
    step = max(1, min(QUEUES_PER_STATEMENT, dialect.max_parameters // 4 - len(statuses)))
    counted: list[int] = []
    for start in range(0, max(len(queues), 1), step):
        chunk = queues[start:start + step]
        first = statuses if start == 0 else []  # the first statement counts the statuses too
        cursor.execute(dialect.failed_counts(table, len(first), len(chunk)),
                       dialect.failed_counts_params(first, chunk, FailureStatus.UNRESOLVED, cap + 1))
        counted += [int(n) for _, n in sorted(cursor.fetchall(), key=lambda row: int(row[0]))]
    result = FailedCounts()
    for status, n in zip(statuses, counted):
        result.by_status[status] = _beyond_cap(cursor, dialect, n, cap, dialect.failed_rows(table, False), [status])
    for name, n in zip(queues, counted[len(statuses):]):
        result.by_queue[name] = _beyond_cap(cursor, dialect, n, cap, dialect.failed_rows(table, True),
                                            [name, FailureStatus.UNRESOLVED])
    return result


def _beyond_cap(cursor: Any, dialect: Any, counted: int, cap: int, select: str, params: list[Any]) -> Count:
    if counted <= cap:
        return Count(counted)
    estimate = dialect.estimate_rows(cursor, select, params) if dialect.estimates_row_counts else None
    if estimate is None:
        return Count(counted, capped=True)
    return Count(max(estimate, counted), estimated=True)
