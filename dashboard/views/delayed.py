"""``/delayed/``: the delayed-message store by due time, filtered by destination; deliver now, delete."""
from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET, require_POST

from core.delayed import delayed_store
from core.errors import InvalidQueueName
from core.messages import Headers
from core.queues import validate_name
from dashboard import actions
from dashboard.security.permissions import viewer_required
from dashboard.views.common import act, back_to, int_param, operator_only, page

#: Rows read from the store for one page (the store lists by due time).
LIST_LIMIT = 1000
DEFAULT_SHOWN = 200


def _queue_url(destination: str) -> str:
    """The destination's queue page; "" for one no queue can have (empty, "/", ".."): the
    destination is message data, and only a valid queue name makes a link."""
    try:
        return reverse("dashboard:queue", args=[validate_name(destination, own_table=True)])
    except (InvalidQueueName, NoReverseMatch):
        return ""


@viewer_required
@require_GET
def delayed(request: HttpRequest) -> HttpResponse:
    destination = request.GET.get("destination", "").strip()[:255]
    shown = int_param(request, "limit", DEFAULT_SHOWN, 1, LIST_LIMIT) or DEFAULT_SHOWN
    problem, rows, now = "", [], None
    store = delayed_store()
    try:
        items, now = store.list(LIST_LIMIT, bodies=False)
    except (DatabaseError, AttributeError) as exc:
        items = []
        problem = f"The delayed store cannot be read: {exc}"
    destinations = sorted({m.destination for m in items})
    if destination:
        items = [m for m in items if m.destination == destination]
    for m in items[:shown]:
        rows.append({"m": m, "due": m.due is not None and now is not None and m.due <= now,
                     "queue_url": _queue_url(m.destination),
                     "delayed_retry": Headers.DELAYED_RETRIES in m.headers,
                     "message_id": m.headers.get(Headers.MESSAGE_ID) or m.id})
    return page(request, "dashboard/delayed.html", {
        "section": "delayed", "rows": rows, "destination": destination, "destinations": destinations,
        "problem": problem, "more": len(items) > shown, "db_now": now, "limit": LIST_LIMIT,
    })


@operator_only("deliver_delayed_now")
@require_POST
def deliver_now(request: HttpRequest, message_id: str) -> HttpResponse:
    return act(request, lambda: actions.deliver_delayed_now(request.user, [message_id], via="web"),
               back_to(request, reverse("dashboard:delayed")))


@operator_only("delete_delayed")
@require_POST
def delete(request: HttpRequest, message_id: str) -> HttpResponse:
    return act(request, lambda: actions.delete_delayed(request.user, [message_id], via="web"),
               back_to(request, reverse("dashboard:delayed")))
