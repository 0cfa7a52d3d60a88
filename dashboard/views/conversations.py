"""``/conversations/``: find a conversation (by conversation id, message id or correlation
id) and ``/conversations/<id>/``: its flow, timeline and sequence, a page of its newest
messages at a time (core.records.conversations), with a failed node's retry going through the
audited retry action of the failed-message pages."""
from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from core.records import conversations
from core.records.conversations import ConversationPage, time_of
from dashboard.conversation import svg as conversation_svg
from dashboard.conversation.flow import flow_rows
from dashboard.security.permissions import viewer_required
from dashboard.views.common import error_response, page

#: Longest search term or conversation id looked up (the columns hold 255 at most).
MAX_TERM = 255


def links_of(found: ConversationPage) -> dict[str, str]:
    """Where each message's label goes: its failed-message page, else its row in the flow."""
    anchors = {n.message_id: f"#m-{i}" for i, n in enumerate(found.nodes)}
    return {n.message_id: reverse("dashboard:failed-detail", args=[n.failed_pk]) if n.failed_pk is not None
            else anchors[n.message_id] for n in found.nodes}


@viewer_required
@require_GET
def search(request: HttpRequest) -> HttpResponse:
    """The search box: a conversation id, message id or correlation id goes to its conversation."""
    term = request.GET.get("q", "").strip()
    if len(term) > MAX_TERM or "\x00" in term:  # PostgreSQL text refuses NUL
        return error_response(request, f"Search for at most {MAX_TERM} characters, without NUL.", 400)
    if term:
        found = conversations.find(term)
        if found:
            return HttpResponseRedirect(reverse("dashboard:conversation", args=[found]))
    return page(request, "dashboard/conversations.html", {"section": "conversations", "q": term,
                                                          "not_found": bool(term)})


@viewer_required
@require_GET
def conversation(request: HttpRequest, conversation_id: str) -> HttpResponse:
    if len(conversation_id) > MAX_TERM or "\x00" in conversation_id:
        return error_response(request, f"A conversation id has at most {MAX_TERM} characters, without NUL.", 400)
    cursor = request.GET.get("cursor", "")
    collapse = request.GET.get("collapse", "1") != "0"
    try:
        found = conversations.page(conversation_id, cursor=cursor or None)
    except conversations.BadCursor as exc:
        return error_response(request, str(exc), 400)
    links = links_of(found)
    started = min((n.first_us for n in found.nodes if n.first_us is not None), default=None)
    rows = flow_rows(found.roots, collapse)
    anchors = {n.message_id: f"m-{i}" for i, n in enumerate(found.nodes)}
    for row in rows:
        if row.node is not None:
            row.anchor = anchors[row.node.message_id]
    keep = {} if collapse else {"collapse": "0"}
    toggle = {**({"cursor": cursor} if cursor else {}), "collapse": "0" if collapse else "1"}
    here = reverse("dashboard:conversation", args=[conversation_id])
    return page(request, "dashboard/conversation.html", {
        "section": "conversations", "c": found, "rows": rows, "collapse": collapse,
        "timeline": conversation_svg.timeline(found.nodes, links),
        "sequence": conversation_svg.sequence(found.nodes, links),
        "older_url": f"{here}?{urlencode({**keep, 'cursor': found.next_cursor})}" if found.next_cursor else "",
        "newest_url": f"{here}?{urlencode(keep)}" if found.paged else "",
        "toggle_url": f"{here}?{urlencode(toggle)}",
        "this_url": request.get_full_path(),
        "failed": sum(1 for n in found.nodes if n.failed),
        "started": time_of(started) if started is not None else None,
    })
