"""``/failed/``: failed-message groups, search, detail, and the operator actions on them
(retry, edit and retry, archive, restore, delete), with bulk operations' progress.

Every action goes through dashboard.actions (role check, the action, the audit entry);
this module only turns forms into selections and outcomes into pages."""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from django.db.models import Q
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from core import failures
from core.messages import Headers
from core.models import BulkOperation, BulkOperationStatus, FailedMessage, FailureStatus
from dashboard import actions
from dashboard.counting import searching as searching_module
from dashboard.actions import ActionError, validate
from dashboard.security.masking import mask_body, mask_headers
from dashboard.security.permissions import viewer_required
from dashboard.views import edits
from dashboard.views.tasks import result_link
from dashboard.views.common import (
    act, back_to, body_view, download, error_response, operator_only, ordered_headers, page,
    parse_date,
)

PAGE_SIZE = 50
GROUPINGS = {"exception": "Exception and frame", "message_type": "Message type", "queue": "Queue"}
STATUSES = [("unresolved", "Unresolved"), ("retry_pending", "Retry pending"), ("archived", "Archived"),
            ("resolved", "Resolved"), ("all", "All")]
#: Shown first on the detail page: where a retry goes, what it is, when it failed.
PINNED = (Headers.MESSAGE_ID, Headers.ENCLOSED_MESSAGE_TYPES, Headers.FAILED_Q, Headers.TIME_OF_FAILURE,
          Headers.EXCEPTION_TYPE, Headers.TIME_SENT, Headers.CORRELATION_ID)
#: Groups listed before "show all" (the largest first).
GROUPS_SHOWN = 30
#: Groups "show all" lists at most (the largest; the page says when there are more).
GROUPS_LISTED = 200
#: Matching messages are counted up to this many ("1000+").
COUNT_CAP = 1000
#: Search fields beyond queue / type: with them, "Retry all unresolved" retries what the search shows.
SEARCH_KEYS = ("q", "exception", "message_id", "since", "until", "group")
NOTHING_SELECTED = "Nothing selected: tick messages first, or use a group's buttons."
#: Seconds after which a still-pending operation is flagged "waiting for a worker".
STALE_PENDING = 10
#: Recent bulk operations listed under the groups.
RECENT_OPERATIONS = 8


# -- reading -----------------------------------------------------------------------------------

def _filters(request: HttpRequest) -> dict[str, Any]:
    """The search form's values (GET, so a view can be bookmarked)."""
    return _filters_of(request.GET)


def _filters_of(g: QueryDict) -> dict[str, Any]:
    status = g.get("status", "unresolved")
    if status not in dict(STATUSES):
        status = "unresolved"
    return {
        "q": g.get("q", "").strip()[:200], "exception": g.get("exception", "").strip()[:200],
        "message_id": g.get("message_id", "").strip()[:255], "queue": g.get("queue", "").strip()[:255],
        "type": g.get("type", "").strip()[:255], "group": g.get("group", "").strip()[:40],
        "status": status, "since": g.get("since", "").strip()[:32], "until": g.get("until", "").strip()[:32],
    }


def _search(f: dict[str, Any]):
    return failures.search(
        text=f["q"] or None, exception=f["exception"] or None, message_id=f["message_id"] or None,
        queue=f["queue"] or None, message_type=f["type"] or None, group=f["group"] or None,
        status=None if f["status"] == "all" else f["status"],
        since=parse_date(f["since"]), until=parse_date(f["until"]))


def _groups(by: str, f: dict[str, Any]) -> list[dict[str, Any]]:
    """core.failures' groups of the chosen status (unresolved when "all") with what each row
    needs: the filter its link applies, whether bulk buttons apply, the confirmation text."""
    status = "unresolved" if f["status"] == "all" else f["status"]
    out = []
    for g in searching_module.cached_groups(by, status, f["queue"], f["type"], GROUPS_LISTED):
        key = g.group_key
        filt = {"group": key} if by == "exception" else ({"type": key} if by == "message_type" else {"queue": key})
        out.append({"key": key, "title": g.title, "count": g.count, "first": g.first_failed, "last": g.last_failed,
                    "filter": filt, "bulk": by == "exception" or bool(key),
                    "confirm": f"Retry the {g.count} message(s) of this group? Each goes back to its queue and is "
                               "processed again: side effects may repeat."})
    return out


def _page_of(qs, request: HttpRequest):
    """Keyset page: newest failure first; ``before=<iso time>,<pk>`` continues after a row."""
    before = request.GET.get("before", "")
    if before:
        when, _, pk = before.rpartition(",")
        try:
            at = dt.datetime.fromisoformat(when)
            # In UTC, as the page gives it out: 9999-12-31T23:59:59-14:00 is valid ISO 8601 but
            # past what the database (and Python's arithmetic) holds: OverflowError.
            at = at.astimezone(dt.timezone.utc) if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)
            last = int(pk)
            if not 0 <= last < 2**63:
                raise ValueError("not a row id")
            qs = qs.filter(Q(time_of_failure__lt=at) | Q(time_of_failure=at, pk__lt=last))
        except (ValueError, OverflowError):
            pass  # not a "before" this page gave out: the first page
    rows = list(qs.defer("body", "headers", "stack_trace", "history")[:PAGE_SIZE + 1])
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    next_before = f"{rows[-1].time_of_failure.isoformat()},{rows[-1].pk}" if more and rows else ""
    return rows, next_before


def recent_operations() -> dict[str, Any]:
    """The recent bulk operations, whether one is under way, and which are still pending after
    STALE_PENDING seconds (no worker took them)."""
    ops = list(BulkOperation.objects.order_by("-created_at", "-id")[:RECENT_OPERATIONS])
    running = any(op.status in (BulkOperationStatus.PENDING, BulkOperationStatus.RUNNING) for op in ops)
    cutoff = timezone.now() - dt.timedelta(seconds=STALE_PENDING)
    stale = {op.pk for op in ops if op.status == BulkOperationStatus.PENDING and op.created_at < cutoff}
    return {"operations": ops, "running": running, "stale": stale}


@viewer_required
@require_GET
def failed_list(request: HttpRequest) -> HttpResponse:
    f = _filters(request)
    by = request.GET.get("by", "exception")
    if by not in GROUPINGS:
        by = "exception"
    problem, note = "", ""
    try:
        searching_module.check_text(f["q"])
        qs, limited = searching_module.bound(_search(f), f["q"])
        note = limited.note
    except searching_module.TextTooShort as exc:
        problem, f["q"] = str(exc), ""
        qs = _search(f)
    rows, next_before = _page_of(qs, request)
    keep = {k: v for k, v in f.items() if v and not (k == "status" and v == "unresolved")}
    filtered = any(k != "status" for k in keep)
    # A search (text, exception, id, dates) shows its results; the groups are the overview.
    searching = any(f[k] for k in ("q", "exception", "message_id", "since", "until"))
    # Counted up to a cap, and not at all for a text search (a second scan as costly as the search).
    matching = None if f["q"] or f["exception"] else qs.order_by()[:COUNT_CAP + 1].count()
    all_groups = request.GET.get("groups") == "all"
    groups = [] if searching else _groups(by, f)
    return page(request, "dashboard/failed.html", {
        "section": "failed", "f": f, "by": by, "by_label": GROUPINGS[by], "groupings": GROUPINGS, "statuses": STATUSES,
        "groups": groups if all_groups else groups[:GROUPS_SHOWN], "more_groups": max(len(groups) - GROUPS_SHOWN, 0)
        if not all_groups else 0, "all_groups_url": f"?{urlencode({**keep, 'by': by, 'groups': 'all'})}",
        "searching": searching, "rows": rows, "matching": None if matching is None else min(matching, COUNT_CAP),
        "matching_capped": matching is not None and matching > COUNT_CAP, "filtered": filtered,
        "next_url": f"?{urlencode({**keep, 'by': by, 'before': next_before})}" if next_before else "",
        "first_url": f"?{urlencode({**keep, 'by': by})}" if request.GET.get("before") else "",
        "this_url": request.get_full_path(), "problem": problem, "search_note": note, **recent_operations(),
    })


@viewer_required
@require_GET
def operations(request: HttpRequest) -> HttpResponse:
    """The recent-operations region: polled every second while one is pending or running;
    once none is, the fragment carries no trigger and the polling stops."""
    return page(request, "dashboard/partials/operations.html", recent_operations())


@viewer_required
@require_GET
def failed_detail(request: HttpRequest, pk: int) -> HttpResponse:
    record = get_object_or_404(FailedMessage, pk=pk)
    headers = mask_headers(failures.headers_of(record))
    return page(request, "dashboard/failed_detail.html", {
        "section": "failed", "record": record, "headers": ordered_headers(headers, PINNED),
        "body": body_view(mask_body(record.body)), "history": list(reversed(record.history or [])),
        "editable": record.status in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED),
        "task_result": result_link(record.message_id, record.message_type),
    })


@viewer_required
@require_GET
def failed_body(request: HttpRequest, pk: int) -> HttpResponse:
    record = get_object_or_404(FailedMessage, pk=pk)
    return download(mask_body(record.body), f"failed-{record.message_id}")


# -- acting ------------------------------------------------------------------------------------

def _selection(request: HttpRequest) -> dict[str, Any]:
    """What a form selected, as dashboard.actions.parse_selection takes it: ``ids`` (checkboxes:
    record ids), a ``group``, or ``all`` (optionally of a ``queue`` / ``message_type``); archive
    forms may add ``older_than_days``.  The action validates it."""
    p = request.POST
    sel: dict[str, Any] = {}
    ids = [i for i in p.getlist("ids") if i]
    if ids:
        sel["ids"] = ids
    elif p.get("all") and any(p.get(k) for k in SEARCH_KEYS):
        sel["ids"] = _searched_ids(p)
    elif p.get("group"):
        sel["group"] = p["group"]
    elif p.get("all"):
        sel["all"] = True
        if p.get("queue"):
            sel["queue"] = p["queue"]
        if p.get("type"):
            sel["message_type"] = p["type"]
    if p.get("older_than_days"):
        sel["older_than_days"] = p["older_than_days"]
    return sel


def _searched_ids(p: QueryDict) -> list[int]:
    """"All unresolved" under a search: the record ids of exactly what the search shows
    (unresolved only), as an ids selection; ActionError when there are more than one
    request may name (narrow the search, or use a group)."""
    f = {**_filters_of(p), "status": "unresolved"}
    try:
        searching_module.check_text(f["q"])
    except searching_module.TextTooShort as exc:
        raise ActionError(str(exc)) from None
    qs, _ = searching_module.bound(_search(f), f["q"])
    ids = list(qs.values_list("pk", flat=True)[:validate.MAX_IDS + 1])
    if len(ids) > validate.MAX_IDS:
        raise ActionError(f"this search matches more than {validate.MAX_IDS} unresolved messages; narrow it "
                          "(or retry by group) to retry what it shows")
    return ids


def _bulk_view(start: Callable[..., Any]) -> Callable[[HttpRequest], HttpResponse]:
    """A POST view running one of the bulk actions on the form's selection."""
    @operator_only(start.__name__)
    @require_POST
    def view(request: HttpRequest) -> HttpResponse:
        try:
            selection = _selection(request)
        except ActionError as exc:
            return error_response(request, exc.message, exc.status)
        if not selection:
            return error_response(request, NOTHING_SELECTED, 400)
        return act(request, lambda: start(request.user, selection, via="web"),
                   back_to(request, reverse("dashboard:failed")))

    view.__name__ = view.__qualname__ = start.__name__
    return view


retry = _bulk_view(actions.retry_failed)
archive = _bulk_view(actions.archive_failed)
restore = _bulk_view(actions.restore_failed)


@operator_only("delete_failed")
@require_POST
def delete(request: HttpRequest) -> HttpResponse:
    selection = _selection(request)
    listing = reverse("dashboard:failed")
    after = back_to(request, listing)
    if after.rstrip("/").rsplit("/", 1)[-1].isdigit():  # the deleted record's own page is gone
        after = listing
    return act(request, lambda: actions.delete_failed(request.user, selection, via="web"), after)


PROTECTED_NOTE = ("Identity headers stay as they are: the copy gets a new message id and keeps the original as "
                  "correlation id.")


@operator_only("edit_and_retry")
def edit_retry(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the form (body, non-protected headers; protected ones locked).  POST: send the copy."""
    record = get_object_or_404(FailedMessage, pk=pk)
    stored = mask_headers(failures.headers_of(record))  # the action puts masked values back
    protected = set(actions.PROTECTED_HEADERS)
    editable = {k: v for k, v in stored.items()
                if k not in protected and k not in failures.FAILURE_HEADERS
                and not k.startswith(failures.EXCEPTION_INFO_PREFIX)}
    locked = [(k, stored[k]) for k in sorted(protected) if k in stored]
    body = mask_body(record.body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if request.method == "POST":
        if text is None:
            return error_response(request, "This body is not text; it cannot be edited here.", 400)
        keys, values = request.POST.getlist("hk"), request.POST.getlist("hv")
        # Protected headers are not in the form: they go along unchanged.
        headers = {**dict(locked), **{k.strip(): v for k, v in zip(keys, values) if k.strip()}}
        try:
            new_body = edits.submitted_body(request, text)
        except edits.BodyRefused as exc:
            return error_response(request, str(exc), exc.status)
        return act(request, lambda: actions.edit_and_retry(request.user, record.pk, new_body, headers, via="web"),
                   reverse("dashboard:failed-detail", args=[record.pk]))
    if text is None:
        return error_response(request, "This body is not text; it cannot be edited here (download it instead).", 400)
    return page(request, "dashboard/failed_edit.html", {
        "section": "failed", "record": record, "text": text, "editable": sorted(editable.items()),
        "locked": locked, "note": PROTECTED_NOTE, "blank_rows": range(3),
        "can_edit": record.status in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED),
    })
