"""``/outbox/``: undispatched outbox records with their age, the table's storage size; dispatch now.

The counts (each capped) and the storage size are shared by every viewer through the
snapshot's cache for SLUICE_DASHBOARD_CACHE_SECONDS, until the next action: three capped
counts of a million-row table cost tens of milliseconds, too much for every view.  The list
(at most LIMIT undispatched records, from the table's undispatched index) is read each time."""
from __future__ import annotations

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from core.cli.outbox import outbox_record_json
from core.outbox import OutboxStats, OutboxStore
from core.conf import get_settings
from dashboard import actions
from dashboard.counting import stats as snapshot_cache
from dashboard.security.permissions import viewer_required
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
            stats = _stats(store)
            rows = [{**outbox_record_json(r), "created": r.created_at} for r in store.records(True, LIMIT)]
    except DatabaseError as exc:
        problem = f"The outbox table cannot be read: {exc}"
    return page(request, "dashboard/outbox.html", {
        "section": "outbox", "stats": stats, "rows": rows, "problem": problem, "limit": LIMIT, "table": store.table,
    })


def _stats(store: OutboxStore) -> OutboxStats:
    key = f"sluice:dashboard:outbox-stats:{store.using}:{store.table}:{COUNT_CAP}"
    found = snapshot_cache.cache_get(key)
    if not isinstance(found, OutboxStats):
        found = store.stats(cap=COUNT_CAP)
        snapshot_cache.cache_set(key, found, get_settings().DASHBOARD_CACHE_SECONDS)
    return found


@operator_only("dispatch_outbox")
@require_POST
def dispatch(request: HttpRequest, message_id: str) -> HttpResponse:
    return act(request, lambda: actions.dispatch_outbox(request.user, [message_id], via="web"),
               reverse("dashboard:outbox"))
