"""``/outbox/``: undispatched outbox records with their age, the table's storage size; dispatch now."""
from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.cli.outbox import outbox_record_json
from core.outbox import OutboxStore
from dashboard import actions
from dashboard.permissions import viewer_required
from dashboard.views.common import act, operator_only, page

LIMIT = 200
#: Counts on the page stop past this ("100000+"): three exact COUNT(*)s of a million-row table
#: cost more than a page may.
COUNT_CAP = 100_000


@viewer_required
@require_GET
def outbox(request: HttpRequest) -> HttpResponse:
    store = OutboxStore()
    problem, stats, rows = "", None, []
    try:
        if not store.exists():
            problem = f"The outbox table {store.table} does not exist (run `sluice setup` with the outbox enabled)."
        else:
            stats = store.stats(cap=COUNT_CAP)
            rows = [{**outbox_record_json(r), "created": r.created_at} for r in store.records(True, LIMIT)]
    except DatabaseError as exc:
        problem = f"The outbox table cannot be read: {exc}"
    return page(request, "dashboard/outbox.html", {
        "section": "outbox", "stats": stats, "rows": rows, "problem": problem, "limit": LIMIT, "table": store.table,
    })


@operator_only("dispatch_outbox")
@require_POST
def dispatch(request: HttpRequest, message_id: str) -> HttpResponse:
    return act(request, lambda: actions.dispatch_outbox(request.user, [message_id], via="web"),
               reverse("dashboard:outbox"))
