"""``/api/conversations/``: find a conversation by a conversation, message or correlation id,
and ``/api/conversations/<id>/``: a page of its messages, newest entries first, with what the
dashboard's conversation view draws (core.records.conversations)."""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from core.records import conversations
from core.conf import MAX_CONVERSATION_PAGE, get_settings
from core.records.conversations import Node, time_of
from dashboard.actions import ActionError
from dashboard.api import schema as out
from dashboard.api.schema import doc
from dashboard.api.params import int_param
from dashboard.api.base import SluiceAPIView

#: Longest id looked up: no column holds more.
MAX_ID = 255


def _iso(us: int | None) -> str | None:
    return None if us is None else time_of(us).isoformat()


def _ms(us: int | None) -> float | None:
    return None if us is None else us / 1000


def message_json(n: Node, on_page: set[str]) -> dict[str, Any]:
    return {"message_id": n.message_id, "message_type": n.message_type, "queue": n.queue, "endpoint": n.endpoint,
            "intent": n.intent, "related_to": n.related_to, "parent_on_page": n.related_to in on_page,
            "correlation_id": n.correlation_id, "originating_endpoint": n.originating_endpoint,
            "originating_host": n.originating_host, "worker": n.worker, "trace_id": n.trace_id,
            "time_sent": _iso(n.time_sent_us), "deliver_at": _iso(n.deliver_at_us), "started": _iso(n.started_us),
            "ended": _iso(n.ended_us), "delayed_ms": _ms(n.delayed_us), "wait_ms": _ms(n.wait_us),
            "processing_ms": _ms(n.processing_us), "clock_skew": n.skewed, "outcome": n.outcome,
            "attempt": n.attempt, "failed": n.failed, "failed_id": n.failed_pk, "failed_status": n.failed_status}


def _unknown(value: str) -> bool:
    """Ids no column can hold (too long, or with a NUL, which PostgreSQL text refuses)."""
    return len(value) > MAX_ID or "\x00" in value


class ConversationSearch(SluiceAPIView):
    @doc(out.ConversationFound, summary="The conversation a conversation id, message id or correlation id belongs "
                                        "to (404 when none)", operation_id="conversations_find",
         parameters=[OpenApiParameter("q", {"type": "string", "minLength": 1, "maxLength": MAX_ID}, required=True,
                                      description="A conversation id, message id or correlation id.")])
    def get(self, request: Request) -> Response:
        term = (request.query_params.get("q") or "").strip()
        if not term:
            raise ActionError("q is required: a conversation id, message id or correlation id")
        if len(term) > MAX_ID:
            raise ActionError(f"q holds at most {MAX_ID} characters")
        found = None if "\x00" in term else conversations.find(term)
        if found is None:
            raise ActionError("no conversation has a message with this id, correlation id or conversation id", 404)
        return Response({"conversation_id": found})


class ConversationItem(SluiceAPIView):
    @doc(out.Conversation, summary="A conversation's messages: the newest entries (attempts and failures) first, "
                                   "grouped per message (oldest first), with the cursor to older ones",
         parameters=[out.CURSOR, OpenApiParameter(
             "limit", out.whole(1, MAX_CONVERSATION_PAGE),
             description="Entries per page (default SLUICE_CONVERSATION_PAGE).")])
    def get(self, request: Request, conversation_id: str) -> Response:
        limit = int_param(request, "limit", get_settings().CONVERSATION_PAGE, 1, MAX_CONVERSATION_PAGE)
        cursor = request.query_params.get("cursor") or None
        if _unknown(conversation_id):
            raise ActionError("no such conversation", 404)
        try:
            found = conversations.page(conversation_id, limit=limit, cursor=cursor)
        except conversations.BadCursor as exc:
            raise ActionError(str(exc)) from None
        if found.empty and not found.paged:
            raise ActionError("nothing is recorded for this conversation", 404)
        on_page = {n.message_id for n in found.nodes}
        return Response({"conversation_id": conversation_id,
                         "messages": [message_json(n, on_page) for n in found.nodes],
                         "entries": found.entries, "older": found.older, "older_capped": found.older_capped,
                         "clock_skew": len(found.skewed), "next_cursor": found.next_cursor})
