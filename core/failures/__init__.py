"""Failed messages: ingested from the error queue into :class:`~core.models.FailedMessage`
records, grouped, searched, retried, archived and purged (SPEC C5, C7).

The package, by what each module holds:

- ``ingestion``: error-queue messages → records, a batch per transaction
  (:func:`ingest_errors`, the :class:`ErrorIngestor` loop);
- ``grouping``: exception type + the frame that raised it (:func:`group_of`);
- ``selections``: which records an operation takes (:func:`by_ids`, :func:`by_group`,
  :func:`all_unresolved`);
- ``bulk``: retry, archive and restore as batched, pollable jobs (:func:`retry`,
  :func:`start_archive`, :func:`start_restore`, :func:`run_operation`);
- ``queue_purge``: a queue's purge as such a job, one at a time per queue (:func:`start_purge`);
- ``retrying``: sending a record's message back, as it was or edited (:func:`edit_and_retry`);
- ``lifecycle``: resolved, archived, restored, deleted, purged after the retention;
- ``search``: groups and search for the CLI and the dashboard;
- ``records``: what they share (history, stored headers, limits, retry headers).

Everything public is importable from ``core.failures``.
"""
from core.failures.bulk import retry, run_archive, run_operation, run_retry, start_archive, start_restore
from core.failures.grouping import first_frame, group_of
from core.failures.ingestion import ErrorIngestor, ingest_batch, ingest_errors
from core.failures.lifecycle import ArchivedFailurePurger, archive, delete, mark_resolved, purge_archived, restore
from core.failures.queue_purge import active_operation, start_purge
from core.failures.records import (
    EXCEPTION_INFO_PREFIX,
    FAILED_PURGE_BATCH_SIZE,
    FAILURE_HEADERS,
    HISTORY_LIMIT,
    MAX_ERROR_LINES,
    MAX_IN,
    POISON_TYPE,
    EDIT_OF,
    RETRIED_AT,
    RETRY_OF,
    RetryRefused,
    headers_of,
)
from core.failures.retrying import EditedCopy, edit_and_retry, retry_headers
from core.failures.search import FailureGroup, groups, search
from core.failures.selections import ELIGIBLE, all_unresolved, by_group, by_ids

__all__ = [
    "retry", "start_archive", "run_operation", "run_retry", "run_archive", "edit_and_retry", "EditedCopy", "retry_headers",
    "ingest_errors", "ingest_batch", "ErrorIngestor", "mark_resolved", "archive", "restore", "delete",
    "purge_archived", "ArchivedFailurePurger", "groups", "search", "FailureGroup", "headers_of",
    "by_ids", "by_group", "all_unresolved", "first_frame", "group_of", "RetryRefused", "ELIGIBLE",
    "RETRY_OF", "RETRIED_AT", "EDIT_OF", "POISON_TYPE", "HISTORY_LIMIT", "MAX_IN", "MAX_ERROR_LINES", "FAILURE_HEADERS",
    "EXCEPTION_INFO_PREFIX", "FAILED_PURGE_BATCH_SIZE", "start_restore", "start_purge", "active_operation",
]
