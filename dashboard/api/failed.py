"""The JSON API of failed messages (search, groups, one record, retry / archive / restore /
delete as bulk operations, edit and retry) and of the bulk operations' progress."""
from __future__ import annotations

from typing import Callable

from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core import failures
from core.models import BulkOperation, FailedMessage, FailureStatus

from dashboard import actions
from dashboard.actions import ActionError
from dashboard.api import cursor
from dashboard.api import schema as out
from dashboard.api import serializers as s
from dashboard.api.params import COUNT_CAP, MAX_LIMIT, act, int_param, request_object, time_param
from dashboard.api.schema import ERRORS_ACT, doc
from dashboard.api.base import SluiceAPIView
from dashboard.counting import searching


class FailedList(SluiceAPIView):
    @doc(out.FailedPage, summary="Search failed messages, newest failure first", operation_id="failed_search",
         parameters=[out.search_text("q", searching.MIN_TEXT)]
         + [out.text(n) for n in ("queue", "group", "exception", "message_id", "message_type")]
         + [out.choice("status", FailureStatus.values), out.when("since"), out.when("until"), out.CURSOR,
            out.limit(50, MAX_LIMIT)])
    def get(self, request: Request) -> Response:
        p = request.query_params
        status_ = p.get("status") or None
        if status_ and status_ not in FailureStatus.values:
            raise ActionError(f"status must be one of {', '.join(FailureStatus.values)}")
        limit = int_param(request, "limit", 50)
        text = (p.get("q") or "").strip()  # as the page does: spaces alone are no search
        try:
            searching.check_text(text)
        except searching.TextTooShort as exc:
            raise ActionError(str(exc)) from None
        filters = dict(text=text or None, exception=p.get("exception") or None,
                       message_id=p.get("message_id") or None, queue=p.get("queue") or None,
                       message_type=p.get("message_type") or None, status=status_,
                       group=p.get("group") or None, since=time_param(request, "since"),
                       until=time_param(request, "until"))
        qs, limited = searching.bound(failures.search(**filters), text)
        # The count is the search's, not the page's: the next pages share it.
        count = searching.shared_count(qs, COUNT_CAP, tuple(sorted(filters.items())))
        rows, next_cursor = cursor.page(qs.defer("headers", "body", "stack_trace", "history"),
                                        p.get("cursor") or None, "time_of_failure", limit)
        return Response({"count": min(count, COUNT_CAP), "count_capped": count > COUNT_CAP,
                         "search_note": limited.note or None,
                         "results": [s.failed_json(r) for r in rows], "next_cursor": next_cursor})


class FailedGroups(SluiceAPIView):
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


class FailedItem(SluiceAPIView):
    @doc(out.FailedDetail, summary="One failed message with stack trace, headers, body and history")
    def get(self, request: Request, pk: int) -> Response:
        record = FailedMessage.objects.filter(pk=pk).first()
        if record is None:
            raise ActionError(f"failed message {pk} does not exist", 404)
        return Response(s.failed_detail_json(record))


def _bulk(action: Callable, code: int = status.HTTP_202_ACCEPTED) -> type[SluiceAPIView]:
    class Bulk(SluiceAPIView):
        audit_action = action.__name__

        @doc(out.Started, code=code, errors=ERRORS_ACT, request=s.SelectionRequest,
             summary=action.__doc__.splitlines()[0] if action.__doc__ else "")
        def post(self, request: Request) -> Response:
            selection = request_object(request)
            return act(lambda: action(request.user, selection, via="api"),
                        lambda r: {"operation": r.operation_id, "count": r.count}, code)

    Bulk.__name__ = Bulk.__qualname__ = f"Failed{action.__name__.title().replace('_', '')}"
    return Bulk


FailedRetry = _bulk(actions.retry_failed)
FailedArchive = _bulk(actions.archive_failed)
FailedRestore = _bulk(actions.restore_failed)


class FailedDelete(SluiceAPIView):
    audit_action = "delete_failed"

    @doc(out.Deleted, errors=ERRORS_ACT, summary="Delete failed-message records for good", request=s.SelectionRequest)
    def post(self, request: Request) -> Response:
        selection = request_object(request)
        return act(lambda: actions.delete_failed(request.user, selection, via="api"),
                    lambda r: {"deleted": r.count})


class FailedEditRetry(SluiceAPIView):
    audit_action = "edit_and_retry"

    @doc(out.EditedCopy, errors=ERRORS_ACT, summary="Send an edited copy (new message id) and resolve the original",
         request=s.EditRetryRequest)
    def post(self, request: Request, pk: int) -> Response:
        data = request_object(request)
        if "body" not in data:
            raise ActionError('"body" is required (the edited message body as text)')
        return act(lambda: actions.edit_and_retry(request.user, pk, data["body"], data.get("headers"), via="api"),
                    lambda r: {"message_id": r.message_id})


class OperationItem(SluiceAPIView):
    @doc(out.Operation, summary="A bulk operation's progress")
    def get(self, request: Request, pk: int) -> Response:
        op = BulkOperation.objects.filter(pk=pk).first()
        if op is None:
            raise ActionError(f"operation {pk} does not exist", 404)
        return Response(s.operation_json(op))


class OperationList(SluiceAPIView):
    @doc(out.OperationList, summary="Recent bulk operations, newest first", operation_id="operations_recent",
         parameters=[out.limit(20, 200), out.CURSOR])
    def get(self, request: Request) -> Response:
        limit = int_param(request, "limit", 20, high=200)
        rows, next_cursor = cursor.page(BulkOperation.objects.order_by("-created_at", "-id"),
                                        request.query_params.get("cursor") or None, "created_at", limit)
        return Response({"operations": [s.operation_json(op) for op in rows], "next_cursor": next_cursor})
