"""Actions on failed messages: retry, archive, restore, edit-and-retry, delete."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping

from django.utils import timezone

from core import failures
from core.conf import get_settings
from core.errors import InvalidHeaders, InvalidMessage, SluiceError
from core.messages import Headers, encode_headers
from core.models import FailedMessage

from dashboard.security import masking
from dashboard.actions import validate
from dashboard.actions.audit import acting, describe_ids
from dashboard.actions.errors import ActionError
from dashboard.actions.operations import BrokerUnavailable, enqueue
from dashboard.actions.result import ActionResult

#: Headers an edit cannot change: the message's identity and the conversation it belongs
#: to (the copy gets its own id; the failure description is dropped anyway).
PROTECTED_HEADERS = frozenset({
    Headers.MESSAGE_ID, Headers.CORRELATION_ID, Headers.CONVERSATION_ID, Headers.ORIGINATING_ENDPOINT,
    Headers.TIME_SENT, failures.RETRY_OF, failures.RETRIED_AT, "NServiceBus.RelatedTo",
})
#: The status a selection's records must have for each kind, for "nothing to …" errors.
NOTHING_TO = {"retry": "unresolved or archived", "archive": "unresolved", "restore": "archived"}
SELECTION_KEYS = ("ids", "message_ids", "group", "all")


def _chunks(items: list) -> list[list]:
    """Pieces small enough for one ``IN (...)`` on every database (SQL Server: 2,100 parameters)."""
    return [items[i:i + failures.MAX_IN] for i in range(0, len(items), failures.MAX_IN)]


@dataclass(frozen=True)
class FailedSelection:
    """A validated selection: the core.failures form, and words for the audit."""

    core: dict[str, Any]
    description: str
    ids: list[str]


def parse_selection(data: Any, *, allow_older_than: bool = False) -> FailedSelection:
    """A selection of failed messages from request data; exactly one of:

    - ``{"ids": [1, 2]}``: record ids (the ``id`` of /api/failed/);
    - ``{"message_ids": ["..."]}``: message ids;
    - ``{"group": "<group_key>"}``;
    - ``{"all": true}`` with optional ``"queue"`` / ``"message_type"`` filters.

    With ``allow_older_than`` (archive) a group or "all" may add ``"older_than_days": N``:
    only records whose latest failure is older than N days.  ActionError for anything else,
    404 when ids match no record."""
    if not isinstance(data, Mapping):
        raise ActionError('a selection is an object: {"ids": [...]}, {"message_ids": [...]}, '
                          '{"group": key} or {"all": true}')
    given = [k for k in SELECTION_KEYS if data.get(k) not in (None, False, "", [])]
    if len(given) != 1:
        raise ActionError('give exactly one of "ids", "message_ids", "group" or "all"')
    key = given[0]
    older = data.get("older_than_days")
    if older is not None and not allow_older_than:
        raise ActionError('"older_than_days" applies to archive only')
    if key == "ids":
        pks = validate.int_ids(data["ids"])
        found = [mid for chunk in _chunks(pks) for mid in
                 FailedMessage.objects.filter(pk__in=chunk).values_list("message_id", flat=True)]
        if not found:
            raise ActionError("none of the selected failed messages exists", 404)
        sel = failures.by_ids(found)
        return FailedSelection(sel, describe_ids("failed messages", pks), [str(p) for p in pks])
    if key == "message_ids":
        ids = validate.string_ids(data["message_ids"])
        if not any(FailedMessage.objects.filter(message_id__in=chunk).exists() for chunk in _chunks(ids)):
            raise ActionError("none of the selected failed messages exists", 404)
        return FailedSelection(failures.by_ids(ids), describe_ids("failed messages", ids), ids)
    if key == "group":
        group = data["group"]
        if not isinstance(group, str) or len(group) > 40:
            raise ActionError("group must be a group key (as in /api/failed/groups/)")
        sel = failures.by_group(group)
        record = FailedMessage.objects.filter(group_key=group).only("group_title").first()
        if record is None:
            raise ActionError(f"no failed messages in group {group!r}", 404)
        description = f"group {record.group_title}"
    else:
        if data["all"] is not True:
            raise ActionError('"all" must be true')
        for name in ("queue", "message_type"):
            if data.get(name) is not None and not isinstance(data[name], str):
                raise ActionError(f'"{name}" must be text')
        sel = failures.all_unresolved(data.get("queue"), data.get("message_type"))
        description = "all unresolved" + (f" of queue {data['queue']}" if data.get("queue") else "") \
            + (f" of type {data['message_type']}" if data.get("message_type") else "")
    if older is not None:
        days = validate.number(older, "older_than_days")
        cutoff = timezone.now() - dt.timedelta(days=days)
        sel["failed_before"] = cutoff.isoformat()
        description += f", failed more than {days:g} day(s) ago"
    return FailedSelection(sel, description, [])


def _start(user: Any, action: str, kind: str, data: Any, via: str, allow_older_than: bool = False) -> ActionResult:
    with acting(user, action, via, target="failed messages") as audit:
        selection = parse_selection(data, allow_older_than=allow_older_than)
        audit.target, audit.ids = selection.description, selection.ids
        running = failures.active_operation(kind, selection.core)
        if running is not None:  # a second click while the first runs
            raise ActionError(f"a {kind} of {selection.description} is already under way (operation {running.pk})",
                              409)
        start = {"retry": failures.retry, "archive": failures.start_archive, "restore": failures.start_restore}[kind]
        op = start(selection.core, requested_by=getattr(user, "username", ""))
        audit.operation_id = op.pk
        if op.total == 0:
            op.delete()
            audit.operation_id = None
            raise ActionError(f"nothing to {kind}: no message of the selection is {NOTHING_TO[kind]}", 409)
        try:
            enqueue(op)
        except BrokerUnavailable as exc:
            raise ActionError(str(exc), 503) from None
        audit.detail = f"operation {op.pk} queued: {op.total} message(s)"
    return ActionResult(action, op.total, f"{kind} of {op.total} message(s) started (operation {op.pk})",
                        audit_id=audit.entry_id, operation_id=op.pk)


def retry_failed(user: Any, selection: Any, *, via: str = "") -> ActionResult:
    """Send failed messages back to their queues: a BulkOperation run by a Celery worker.
    ``result.operation_id`` is the operation a page / ``GET /api/operations/<id>/`` polls."""
    return _start(user, "retry_failed", "retry", selection, via)


def archive_failed(user: Any, selection: Any, *, via: str = "") -> ActionResult:
    """Archive unresolved failed messages (restorable), as a BulkOperation; a group or "all"
    selection may carry ``older_than_days``."""
    return _start(user, "archive_failed", "archive", selection, via, allow_older_than=True)


def restore_failed(user: Any, selection: Any, *, via: str = "") -> ActionResult:
    """Archived → unresolved, as a BulkOperation a Celery worker runs in batches (a group can
    hold a million records: too many for one request)."""
    return _start(user, "restore_failed", "restore", selection, via)


def delete_failed(user: Any, selection: Any, *, via: str = "") -> ActionResult:
    """Remove failed-message records for good (ids or message ids only)."""
    with acting(user, "delete_failed", via, target="failed messages") as audit:
        if isinstance(selection, Mapping) and (selection.get("group") or selection.get("all")):
            raise ActionError("delete takes ids or message_ids; archive a group instead (restorable)")
        parsed = parse_selection(selection)
        audit.target, audit.ids = parsed.description, parsed.ids
        deleted = failures.delete(parsed.core["ids"])
        if not deleted:
            raise ActionError("none of the selected failed messages exists", 404)
        audit.detail = f"{deleted} deleted"
    return ActionResult("delete_failed", deleted, f"{deleted} failed message(s) deleted", audit_id=audit.entry_id)


def _edited_headers(stored: dict[str, str], new_headers: Any) -> dict[str, str]:
    """The copy's headers: the operator's headers replace the stored non-protected ones;
    protected ones are kept as stored whether given or not (ActionError when given changed)."""
    base = dict(stored)  # failures.retry_headers drops the failure description afterwards
    if new_headers is None:
        return base
    if not isinstance(new_headers, Mapping):
        raise ActionError("headers must be an object of text values")
    try:
        encode_headers(new_headers)
    except (InvalidHeaders, SluiceError, TypeError, ValueError) as exc:
        raise ActionError(f"headers: {exc}") from None
    for name in PROTECTED_HEADERS:
        if name in new_headers and new_headers[name] != base.get(name):
            raise ActionError(f"header {name} is protected and cannot be edited")
    edited = {k: v for k, v in new_headers.items() if k not in PROTECTED_HEADERS}
    return {**{k: v for k, v in base.items() if k in PROTECTED_HEADERS}, **edited}


def edit_and_retry(user: Any, record_id: Any, body: Any, headers: Any = None, *, via: str = "") -> ActionResult:
    """Send an edited copy of a failed message to its queue and mark the original resolved
    (core.failures.edit_and_retry: one transaction; the copy gets a new message id and the
    original's as its correlation id).  ``headers`` (optional) replace the non-protected
    headers.  ActionError 404 / 409 / 400 for a missing record, one that cannot be retried
    (resolved, queue gone), bad body or headers."""
    with acting(user, "edit_and_retry", via, target=f"failed message {record_id}") as audit:
        (pk,) = validate.int_ids([record_id], "failed message id")
        if not isinstance(body, str):
            raise ActionError("body must be text")
        using = get_settings().DATABASE
        record = FailedMessage.objects.using(using).filter(pk=pk).first()
        if record is None:
            raise ActionError(f"failed message {pk} does not exist", 404)
        audit.target, audit.ids = f"failed message {record.message_id}", [str(pk)]
        stored = failures.headers_of(record)
        try:  # what the operator saw masked and left as "***" is the stored value
            body = masking.unmask_body(body, record.body)
        except masking.MaskedBodyInvalid as exc:
            raise ActionError(str(exc)) from None
        if isinstance(headers, Mapping):
            headers = masking.unmask_headers(headers, stored)
        edited = None if headers is None else _edited_headers(stored, headers)
        try:
            copy = failures.edit_and_retry(record.message_id, body, edited, queue=record.original_queue,
                                           requested_by=getattr(user, "username", ""), using=using)
        except failures.RetryRefused as exc:
            raise ActionError(str(exc), 409) from None
        except (InvalidHeaders, InvalidMessage) as exc:
            raise ActionError(str(exc)) from None
        queue = copy.record.original_queue
        audit.detail = f"copy {copy.message_id} sent to {queue}; original resolved"
    return ActionResult("edit_and_retry", 1, f"edited copy sent to {queue} as message {copy.message_id}",
                        audit_id=audit.entry_id, message_id=copy.message_id)
