"""The JSON API: reads for viewers, actions for operators (through dashboard.actions, which
checks the role again and writes the audit).  Shapes: dashboard/api/serializers.py."""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core import failures
from core.conf import get_settings
from core.delayed import delayed_store
from core.messages import Message
from core.models import BulkOperation, FailedMessage, FailureStatus
from core.outbox import OutboxStore
from core.records.run import last_run
from core.transport import Transport

from dashboard import actions, metric_windows, searching, stats
from dashboard.actions import ActionError
from dashboard.actions import validate
from dashboard.api import cursor
from dashboard.api import schema as out
from dashboard.api import serializers as s
from dashboard.api.schema import ERRORS_ACT, ERRORS_ACT_MORE, ERRORS_READ, doc
from dashboard.models import AuditEntry, AuditOutcome

#: What ?bodies= takes ("" and the no-words: without bodies).
BODIES_CHOICES = ("", "0", "1", "false", "true", "no", "yes")
#: Rows a list returns at most (``limit`` is clamped to this).
MAX_LIMIT = 500
#: Failed-message searches count matches up to this many ("count_capped": true beyond).
COUNT_CAP = 10_000


def int_param(request: Request, name: str, default: int, low: int = 1, high: int = MAX_LIMIT) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ActionError(f"{name} must be a whole number, not {raw[:40]!r}") from None
    if not low <= value <= high:
        raise ActionError(f"{name} must be between {low} and {high}")
    return value


def time_param(request: Request, name: str) -> dt.datetime | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        # In UTC: an offset such as -23:45 is valid ISO 8601 but out of PostgreSQL's range.
        return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    except (ValueError, OverflowError):
        raise ActionError(f"{name} must be an ISO 8601 time, not {raw[:40]!r}") from None


def _body(request: Request) -> dict[str, Any]:
    data = request.data
    if not isinstance(data, dict):
        raise ActionError("the request body must be a JSON object")
    return data


def _act(fn: Callable[[], actions.ActionResult], make: Callable[[actions.ActionResult], dict],
         code: int = status.HTTP_200_OK) -> Response:
    result = fn()
    stats.forget_snapshot()  # the next overview shows the change (throughput samples stay)
    return Response(make(result), status=code)


# -- queues -------------------------------------------------------------------------------------------

class QueueList(APIView):
    @doc(out.QueueList, summary="Every queue with its counts (cached a few seconds)")
    def get(self, request: Request) -> Response:
        snap = stats.snapshot()
        return Response({"queues": [s.queue_json(q) for q in snap.queues], "at": snap.at.isoformat(),
                         "problem": snap.problem or None})


def _with_bodies(transport: Transport, queue: str, listed: list[tuple[Message, int]],
                 after: int) -> list[tuple[Message, int]]:
    """The leading messages of ``listed`` whose bodies fit SLUICE_DASHBOARD_API_BODY_BYTES
    (at least one), read again with their bodies.  Rows taken meanwhile let later ones in:
    those are cut to the budget too, so a response never carries more than it allows."""
    budget, total, count = get_settings().DASHBOARD_API_BODY_BYTES, 0, 0
    for _, size in listed:
        if count and total + size > budget:
            break
        total, count = total + size, count + 1
    kept, total = [], 0
    for m in transport.browse(queue, limit=max(count, 1), after=after):
        if kept and total + len(m.body) > budget:
            break
        kept.append((m, len(m.body)))
        total += len(m.body)
    return kept


class QueueMessages(APIView):
    @doc(out.MessageList, summary="Messages of a queue in FIFO order (keyset on row_version); bodies only with "
                                  "bodies=1, and then only as many as fit SLUICE_DASHBOARD_API_BODY_BYTES "
                                  "(next_after continues)",
         parameters=[out.limit(50, MAX_LIMIT),
                     OpenApiParameter("after", out.whole(0, 2**63 - 1)),
                     out.choice("bodies", BODIES_CHOICES[1:])])
    def get(self, request: Request, name: str) -> Response:
        info = validate.queue(name)
        limit = int_param(request, "limit", 50)
        after = int_param(request, "after", 0, 0, 2**63 - 1)
        transport = Transport()
        listed = transport.browse_sizes(info.name, limit=limit, after=after)
        more = len(listed) == limit
        bodies_raw = request.query_params.get("bodies", "")
        if bodies_raw not in BODIES_CHOICES:
            raise ActionError(f"bodies must be one of {', '.join(BODIES_CHOICES[1:])}, not {bodies_raw[:20]!r}")
        bodies = bodies_raw in ("1", "true", "yes")
        if bodies and listed:
            shown = _with_bodies(transport, info.name, listed, after)
            more = more or len(shown) < len(listed)
            listed = shown
        return Response({"messages": [s.message_json(m, size, bodies) for m, size in listed],
                         "next_after": listed[-1][0].row_version if more and listed else None})


class QueueMessage(APIView):
    audit_action = "delete_messages"

    @doc(out.Deleted, errors=ERRORS_ACT, summary="Delete one message", request=None)
    def delete(self, request: Request, name: str, message_id: str) -> Response:
        return _act(lambda: actions.delete_messages(request.user, name, [message_id], via="api"),
                    lambda r: {"deleted": r.count})


class QueueMessageMove(APIView):
    audit_action = "move_message"

    @doc(out.Moved, errors=ERRORS_ACT, summary="Move one message to another queue", request=s.MoveRequest)
    def post(self, request: Request, name: str, message_id: str) -> Response:
        to = _body(request).get("to")
        return _act(lambda: actions.move_message(request.user, name, message_id, to, via="api"),
                    lambda r: {"moved": r.count, "to": to})


class QueuePurge(APIView):
    audit_action = "purge_queue"

    @doc(out.Started, code=status.HTTP_202_ACCEPTED, errors=ERRORS_ACT,
         summary="Delete every message of a queue: a bulk operation the workers "
         "run (poll GET /api/operations/<operation>/); count is the queue's estimated size", request=s.PurgeRequest)
    def post(self, request: Request, name: str) -> Response:
        confirm = _body(request).get("confirm")
        return _act(lambda: actions.purge_queue(request.user, name, confirm, via="api"),
                    lambda r: {"operation": r.operation_id, "count": r.count}, status.HTTP_202_ACCEPTED)


# -- delayed ----------------------------------------------------------------------------------------

class DelayedList(APIView):
    @doc(out.DelayedList, errors={**ERRORS_READ, 501: "The delayed store cannot list."},
         summary="Delayed messages by due time", parameters=[out.text("destination"), out.limit(100, 1000)])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 100, high=1000)
        destination = request.query_params.get("destination") or None
        store = delayed_store()
        if not hasattr(store, "list"):
            raise ActionError(f"the delayed store {type(store).__name__} cannot list its messages", 501)
        # The store lists by due time; a destination filter looks at up to 1,000 of them.
        rows, now = store.list(1000 if destination else limit, bodies=False)
        if destination:
            rows = [m for m in rows if m.destination == destination][:limit]
        return Response({"delayed": [s.delayed_json(m) for m in rows], "now": now.isoformat() if now else None})


class DelayedDeliverNow(APIView):
    audit_action = "deliver_delayed_now"

    @doc(out.Delivered, errors=ERRORS_ACT_MORE, summary="Make a delayed message due now", request=None)
    def post(self, request: Request, message_id: str) -> Response:
        return _act(lambda: actions.deliver_delayed_now(request.user, [message_id], via="api"),
                    lambda r: {"delivered": r.count})


class DelayedItem(APIView):
    audit_action = "delete_delayed"

    @doc(out.Deleted, errors=ERRORS_ACT_MORE, summary="Delete a delayed message", request=None)
    def delete(self, request: Request, message_id: str) -> Response:
        return _act(lambda: actions.delete_delayed(request.user, [message_id], via="api"),
                    lambda r: {"deleted": r.count})


# -- failed messages ----------------------------------------------------------------------------------

class FailedList(APIView):
    @doc(out.FailedPage, summary="Search failed messages, newest failure first", operation_id="failed_search",
         parameters=[out.text(n) for n in ("q", "queue", "group", "exception", "message_id", "message_type")]
         + [out.choice("status", FailureStatus.values), out.when("since"), out.when("until"), out.CURSOR,
            out.limit(50, MAX_LIMIT)])
    def get(self, request: Request) -> Response:
        p = request.query_params
        status_ = p.get("status") or None
        if status_ and status_ not in FailureStatus.values:
            raise ActionError(f"status must be one of {', '.join(FailureStatus.values)}")
        limit = int_param(request, "limit", 50)
        try:
            searching.check_text(p.get("q") or "")
        except searching.TextTooShort as exc:
            raise ActionError(str(exc)) from None
        qs = failures.search(text=p.get("q") or None, exception=p.get("exception") or None,
                             message_id=p.get("message_id") or None, queue=p.get("queue") or None,
                             message_type=p.get("message_type") or None, status=status_,
                             group=p.get("group") or None, since=time_param(request, "since"),
                             until=time_param(request, "until"))
        qs, limited = searching.bound(qs, p.get("q") or "")
        count = qs.order_by()[:COUNT_CAP + 1].count()
        rows, next_cursor = cursor.page(qs.defer("headers", "body", "stack_trace", "history"),
                                        p.get("cursor") or None, "time_of_failure", limit)
        return Response({"count": min(count, COUNT_CAP), "count_capped": count > COUNT_CAP,
                         "search_note": limited.note or None,
                         "results": [s.failed_json(r) for r in rows], "next_cursor": next_cursor})


class FailedGroups(APIView):
    @doc(out.GroupList, summary="Failed messages grouped (exception type + first frame, or by type / queue)",
         parameters=[out.choice("by", ("exception", "message_type", "queue")),
                     out.choice("status", FailureStatus.values)])
    def get(self, request: Request) -> Response:
        by = request.query_params.get("by") or "exception"
        status_ = request.query_params.get("status") or FailureStatus.UNRESOLVED
        if status_ not in FailureStatus.values:
            raise ActionError(f"status must be one of {', '.join(FailureStatus.values)}")
        if by not in ("exception", "message_type", "queue"):
            raise ActionError('by must be "exception", "message_type" or "queue"')
        return Response({"groups": [
            {"key": g.group_key, "title": g.title, "count": g.count,
             "first_failed_at": g.first_failed.isoformat() if g.first_failed else None,
             "last_failed_at": g.last_failed.isoformat(), "exception_type": g.exception_type}
            for g in searching.cached_groups(by, status_, "", "", limit=1000)]})


class FailedItem(APIView):
    @doc(out.FailedDetail, summary="One failed message with stack trace, headers, body and history")
    def get(self, request: Request, pk: int) -> Response:
        record = FailedMessage.objects.filter(pk=pk).first()
        if record is None:
            raise ActionError(f"failed message {pk} does not exist", 404)
        return Response(s.failed_detail_json(record))


def _bulk(action: Callable, code: int = status.HTTP_202_ACCEPTED) -> type[APIView]:
    class Bulk(APIView):
        audit_action = action.__name__

        @doc(out.Started, code=code, errors=ERRORS_ACT, request=s.SelectionRequest,
             summary=action.__doc__.splitlines()[0] if action.__doc__ else "")
        def post(self, request: Request) -> Response:
            selection = _body(request)
            return _act(lambda: action(request.user, selection, via="api"),
                        lambda r: {"operation": r.operation_id, "count": r.count}, code)

    Bulk.__name__ = Bulk.__qualname__ = f"Failed{action.__name__.title().replace('_', '')}"
    return Bulk


FailedRetry = _bulk(actions.retry_failed)
FailedArchive = _bulk(actions.archive_failed)
FailedRestore = _bulk(actions.restore_failed)


class FailedDelete(APIView):
    audit_action = "delete_failed"

    @doc(out.Deleted, errors=ERRORS_ACT, summary="Delete failed-message records for good", request=s.SelectionRequest)
    def post(self, request: Request) -> Response:
        selection = _body(request)
        return _act(lambda: actions.delete_failed(request.user, selection, via="api"),
                    lambda r: {"deleted": r.count})


class FailedEditRetry(APIView):
    audit_action = "edit_and_retry"

    @doc(out.EditedCopy, errors=ERRORS_ACT, summary="Send an edited copy (new message id) and resolve the original",
         request=s.EditRetryRequest)
    def post(self, request: Request, pk: int) -> Response:
        data = _body(request)
        if "body" not in data:
            raise ActionError('"body" is required (the edited message body as text)')
        return _act(lambda: actions.edit_and_retry(request.user, pk, data["body"], data.get("headers"), via="api"),
                    lambda r: {"message_id": r.message_id})


class OperationItem(APIView):
    @doc(out.Operation, summary="A bulk operation's progress")
    def get(self, request: Request, pk: int) -> Response:
        op = BulkOperation.objects.filter(pk=pk).first()
        if op is None:
            raise ActionError(f"operation {pk} does not exist", 404)
        return Response(s.operation_json(op))


class OperationList(APIView):
    @doc(out.OperationList, summary="Recent bulk operations, newest first", operation_id="operations_recent",
         parameters=[out.limit(20, 200), out.CURSOR])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 20, high=200)
        rows, next_cursor = cursor.page(BulkOperation.objects.order_by("-created_at", "-id"),
                                        request.query_params.get("cursor") or None, "created_at", limit)
        return Response({"operations": [s.operation_json(op) for op in rows], "next_cursor": next_cursor})


# -- outbox, audit ------------------------------------------------------------------------------------

class OutboxList(APIView):
    @doc(out.OutboxList, summary="Undispatched outbox records, oldest first", parameters=[out.limit(50, MAX_LIMIT)])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 50)
        store = OutboxStore()
        if not store.exists():
            return Response({"records": [], "table": store.table, "exists": False})
        return Response({"table": store.table, "exists": True, "records": [
            {"message_id": r.message_id, "created_at": r.created_at.isoformat() if r.created_at else None,
             "quarantined": r.quarantined, "last_error": r.last_error, "size": len(r.operations or "")}
            for r in store.records(undispatched_only=True, limit=limit)]})


class OutboxDispatch(APIView):
    audit_action = "dispatch_outbox"

    @doc(out.Dispatched, errors=ERRORS_ACT, summary="Dispatch an outbox record now", request=None)
    def post(self, request: Request, message_id: str) -> Response:
        return _act(lambda: actions.dispatch_outbox(request.user, [message_id], via="api"),
                    lambda r: {"dispatched": r.count})


class AuditList(APIView):
    @doc(out.AuditPage, summary="Operator actions, newest first", parameters=[
        out.text("user"), out.choice("action", actions.AUDITED), out.choice("outcome", AuditOutcome.values),
        out.when("since"), out.when("until"), out.limit(100, MAX_LIMIT), out.CURSOR])
    def get(self, request: Request) -> Response:
        p = request.query_params
        qs = AuditEntry.objects.all()
        if p.get("user"):
            qs = qs.filter(username=p["user"])
        if p.get("action"):
            if p["action"] not in actions.AUDITED:
                raise ActionError(f"action must be one of {', '.join(actions.AUDITED)}")
            qs = qs.filter(action=p["action"])
        if p.get("outcome"):
            if p["outcome"] not in AuditOutcome.values:
                raise ActionError(f"outcome must be one of {', '.join(AuditOutcome.values)}")
            qs = qs.filter(outcome=p["outcome"])
        since, until = time_param(request, "since"), time_param(request, "until")
        if since:
            qs = qs.filter(at__gte=since)
        if until:
            qs = qs.filter(at__lt=until)
        limit = int_param(request, "limit", 100)
        rows, next_cursor = cursor.page(qs.order_by("-at", "-id"), p.get("cursor") or None, "at", limit)
        return Response({"entries": [s.audit_json(e) for e in rows], "next_cursor": next_cursor})


# -- metrics (the analytics pipeline) --------------------------------------------------------------

class MetricList(APIView):
    @doc(out.MetricList, summary="The pipeline's newest metric windows (listed oldest first) and its last run; "
                                 "next_before pages back to older ones",
         parameters=[out.text("queue"), out.text("message_type"), out.choice("window", ("60", "3600"), empty=False),
                     out.when("since"), out.when("before"), out.limit(metric_windows.MAX_WINDOWS, metric_windows.MAX_WINDOWS)])
    def get(self, request: Request) -> Response:
        filters, _, since = metric_windows.window_query(request.query_params)
        limit = int_param(request, "limit", metric_windows.MAX_WINDOWS, high=metric_windows.MAX_WINDOWS)
        windows, older = metric_windows.window_page(filters, since, metric_windows.before_param(request.query_params),
                                                    limit)
        return Response({"windows": [metric_windows.window_json(w) for w in windows],
                         "last_run": metric_windows.run_json(last_run()),
                         "next_before": older.isoformat() if older else None})


class MetricRun(APIView):
    audit_action = "run_pipeline"

    @doc(out.RunStarted, code=status.HTTP_202_ACCEPTED, errors=ERRORS_ACT,
         summary="Run the analytics pipeline now (a Celery task); poll GET /api/metrics/ for last_run",
         request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        data = request.data if request.body else {}
        if not isinstance(data, dict):
            raise ActionError("the request body must be a JSON object (or empty)")
        since = metric_windows.since_param(data.get("since"))
        return _act(lambda: actions.run_pipeline(request.user, since, via="api"),
                    lambda r: {"run": r.run_id}, status.HTTP_202_ACCEPTED)
