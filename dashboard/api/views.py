"""The JSON API of queues, delayed messages, the outbox, the audit and metrics: reads for viewers,
actions for operators (through dashboard.actions, which checks the role again and writes the
audit).  Failed messages and bulk operations: dashboard/api/failed.py.  Shapes: serializers.py."""
from __future__ import annotations

import json

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from core.runtime import limits, pauses
from core.conf import get_settings
from core.delayed import delayed_store
from core.messages import Message
from core.outbox import OutboxStore
from core.records.run import last_run
from core.transport import Transport

from dashboard import actions
from dashboard.charts import metric_windows
from dashboard.counting import stats
from dashboard.actions import ActionError
from dashboard.actions import validate
from dashboard.api import cursor
from dashboard.api import schema as out
from dashboard.api import serializers as s
from dashboard.api.params import MAX_LIMIT, act, int_param, request_object, time_param
from dashboard.api.schema import ERRORS_ACT, ERRORS_ACT_MORE, ERRORS_READ, doc
from dashboard.api.base import SluiceAPIView
from dashboard.models import AuditEntry, AuditOutcome

#: What ?bodies= takes ("" and the no-words: without bodies).
BODIES_CHOICES = ("", "0", "1", "false", "true", "no", "yes")
# -- queues -------------------------------------------------------------------------------------------

class QueueList(SluiceAPIView):
    @doc(out.QueueList, summary="Every queue with its counts (cached a few seconds)")
    def get(self, request: Request) -> Response:
        snap = stats.snapshot()
        paused = pauses.paused_queues()  # not cached: a pause shows at once
        limited = limits.limits_in_force()  # nor a limit
        return Response({"queues": [{**s.queue_json(q), "paused": q.name in paused, **_limit_columns(limited, q.name)}
                                    for q in snap.queues],
                         "at": snap.at.isoformat(),
                         "problem": snap.problem or None})


def _limit_columns(limited: dict[str, limits.Limits], name: str) -> dict[str, int | None]:
    found = limited.get(name)
    return {"concurrency_limit": found.concurrency if found else None, "rate_limit": found.rate if found else None}


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


class QueueMessages(SluiceAPIView):
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


class QueueSend(SluiceAPIView):
    audit_action = "send_message"

    @doc(out.SentMessage, code=status.HTTP_201_CREATED, errors=ERRORS_ACT, request=s.SendRequest,
         summary="Send a message to a queue through the one send path (the dashboard's send form); "
                 "control headers are refused")
    def post(self, request: Request, name: str) -> Response:
        data = request_object(request)
        if "body" not in data:
            raise ActionError("body is required: any JSON value")
        sent = actions.send_message(request.user, name, body=json.dumps(data["body"]),
                                    message_type=data.get("message_type") or "", headers=data.get("headers"),
                                    delay=data.get("delay"), ttl=data.get("ttl"), via="api")
        stats.forget_snapshot()
        return Response({"message_id": sent.message_id, "queue": name, "delayed": sent.delayed,
                         "row_version": sent.row_version}, status=status.HTTP_201_CREATED)


class QueueMessage(SluiceAPIView):
    audit_action = "delete_messages"

    @doc(out.Deleted, errors=ERRORS_ACT, summary="Delete one message", request=None)
    def delete(self, request: Request, name: str, message_id: str) -> Response:
        return act(lambda: actions.delete_messages(request.user, name, [message_id], via="api"),
                    lambda r: {"deleted": r.count})


class QueueMessageMove(SluiceAPIView):
    audit_action = "move_message"

    @doc(out.Moved, errors=ERRORS_ACT, summary="Move one message to another queue", request=s.MoveRequest)
    def post(self, request: Request, name: str, message_id: str) -> Response:
        to = request_object(request).get("to")
        return act(lambda: actions.move_message(request.user, name, message_id, to, via="api"),
                    lambda r: {"moved": r.count, "to": to})


class QueuePurge(SluiceAPIView):
    audit_action = "purge_queue"

    @doc(out.Started, code=status.HTTP_202_ACCEPTED, errors=ERRORS_ACT,
         summary="Delete every message of a queue: a bulk operation the workers "
         "run (poll GET /api/operations/<operation>/); count is the queue's estimated size", request=s.PurgeRequest)
    def post(self, request: Request, name: str) -> Response:
        confirm = request_object(request).get("confirm")
        return act(lambda: actions.purge_queue(request.user, name, confirm, via="api"),
                    lambda r: {"operation": r.operation_id, "count": r.count}, status.HTTP_202_ACCEPTED)


def _pause_state(name: str, result: actions.ActionResult) -> dict:
    found = pauses.pause_of(name)
    return {"queue": name, "paused": found is not None, "changed": bool(result.count),
            "paused_at": found.paused_at.isoformat() if found else None, "paused_by": found.paused_by if found else None}


class QueuePause(SluiceAPIView):
    audit_action = "pause_queue"

    @doc(out.PauseState, errors=ERRORS_ACT, request=None,
         summary="Pause a queue: no worker receives from it until it is resumed (sends still land, due delayed "
                 "messages still arrive, expiry purges still run); pausing a paused queue changes nothing")
    def post(self, request: Request, name: str) -> Response:
        return act(lambda: actions.pause_queue(request.user, name, via="api"), lambda r: _pause_state(name, r))


class QueueResume(SluiceAPIView):
    audit_action = "resume_queue"

    @doc(out.PauseState, errors=ERRORS_ACT, request=None, summary="Resume a paused queue")
    def post(self, request: Request, name: str) -> Response:
        return act(lambda: actions.resume_queue(request.user, name, via="api"), lambda r: _pause_state(name, r))


def _limits_state(name: str, result: actions.ActionResult | None) -> dict:
    return {**limits.limits_of(validate.queue(name).name).as_json(), "changed": bool(result and result.count)}


class QueueLimits(SluiceAPIView):
    audit_action = "limit_queue"

    @doc(out.LimitsState, summary="A queue's limits in force across every worker: at most concurrency messages "
                                  "at once and rate per second (an operator's win over SLUICE_QUEUE_LIMITS)")
    def get(self, request: Request, name: str) -> Response:
        return Response(_limits_state(name, None))

    @doc(out.LimitsState, errors=ERRORS_ACT, request=s.LimitsRequest,
         summary="Set an operator's limits on a queue (kept in the database, audited; they win over "
                 "SLUICE_QUEUE_LIMITS); a limit left out keeps the one in force, null lifts it")
    def post(self, request: Request, name: str) -> Response:
        body = request_object(request)
        unknown = sorted(set(body) - {"concurrency", "rate"})
        if unknown:
            raise ActionError(f"unknown field(s) {', '.join(map(str, unknown))[:200]}: the limits are concurrency "
                              "and rate")
        for kind, value in body.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ActionError(f"{kind} must be a whole number 1–10000 or null, not {json.dumps(value)[:40]}")

        def apply() -> actions.ActionResult:
            now = limits.limits_of(validate.queue(name).name)
            return actions.limit_queue(request.user, name, body.get("concurrency", now.concurrency),
                                       body.get("rate", now.rate), via="api")
        return act(apply, lambda r: _limits_state(name, r))

    @doc(out.LimitsState, errors=ERRORS_ACT, request=None,
         summary="Drop the operator's limits on a queue: SLUICE_QUEUE_LIMITS applies again")
    def delete(self, request: Request, name: str) -> Response:
        return act(lambda: actions.clear_queue_limits(request.user, name, via="api"), lambda r: _limits_state(name, r))


# -- delayed ----------------------------------------------------------------------------------------

class DelayedList(SluiceAPIView):
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


class DelayedDeliverNow(SluiceAPIView):
    audit_action = "deliver_delayed_now"

    @doc(out.Delivered, errors=ERRORS_ACT_MORE, summary="Make a delayed message due now", request=None)
    def post(self, request: Request, message_id: str) -> Response:
        return act(lambda: actions.deliver_delayed_now(request.user, [message_id], via="api"),
                    lambda r: {"delivered": r.count})


class DelayedItem(SluiceAPIView):
    audit_action = "delete_delayed"

    @doc(out.Deleted, errors=ERRORS_ACT_MORE, summary="Delete a delayed message", request=None)
    def delete(self, request: Request, message_id: str) -> Response:
        return act(lambda: actions.delete_delayed(request.user, [message_id], via="api"),
                    lambda r: {"deleted": r.count})


# -- outbox, audit ------------------------------------------------------------------------------------

class OutboxList(SluiceAPIView):
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


class OutboxDispatch(SluiceAPIView):
    audit_action = "dispatch_outbox"

    @doc(out.Dispatched, errors=ERRORS_ACT, summary="Dispatch an outbox record now", request=None)
    def post(self, request: Request, message_id: str) -> Response:
        return act(lambda: actions.dispatch_outbox(request.user, [message_id], via="api"),
                    lambda r: {"dispatched": r.count})


class AuditList(SluiceAPIView):
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

class MetricList(SluiceAPIView):
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


class MetricRun(SluiceAPIView):
    audit_action = "run_pipeline"

    @doc(out.RunStarted, code=status.HTTP_202_ACCEPTED, errors=ERRORS_ACT,
         summary="Run the analytics pipeline now (a Celery task); poll GET /api/metrics/ for last_run",
         request=OpenApiTypes.OBJECT)
    def post(self, request: Request) -> Response:
        data = request.data if request.body else {}
        if not isinstance(data, dict):
            raise ActionError("the request body must be a JSON object (or empty)")
        since = metric_windows.since_param(data.get("since"))
        return act(lambda: actions.run_pipeline(request.user, since, via="api"),
                    lambda r: {"run": r.run_id}, status.HTTP_202_ACCEPTED)
