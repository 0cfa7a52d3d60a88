"""``/audit/``: every operator action (who, what, which messages, when, outcome), newest first,
filterable by user, action and date; keyset pages on the entry id."""
from __future__ import annotations

import datetime as dt

from django.http import HttpRequest, HttpResponse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from dashboard.models import AuditEntry
from dashboard.security.permissions import viewer_required
from dashboard.views.common import date_param, int_param, page

PAGE_SIZE = 100
#: The user and action drop-downs list what the newest this-many entries hold: a DISTINCT over
#: an audit log kept for years would read all of it on every view.  Older names still filter
#: when typed into the URL (?user=…).
CHOICES_SCAN = 10_000


def _day_after(day: dt.datetime) -> dt.datetime | None:
    """The start of the next day; None (no upper bound) after 9999-12-31, the last one."""
    try:
        return day + dt.timedelta(days=1)
    except OverflowError:
        return None


def _choices(column: str, selected: str, limit: int) -> list[str]:
    """Distinct values of ``column`` among the newest CHOICES_SCAN entries (and ``selected``)."""
    newest = AuditEntry.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    recent = AuditEntry.objects.filter(pk__gt=newest - CHOICES_SCAN).order_by()
    values = set(recent.values_list(column, flat=True).distinct()[:limit])
    return sorted(values | ({selected} if selected else set()))


@viewer_required
@require_GET
def audit(request: HttpRequest) -> HttpResponse:
    user = request.GET.get("user", "").strip()[:150]
    action = request.GET.get("action", "").strip()[:40]
    qs = AuditEntry.objects.all()
    if user:
        qs = qs.filter(username=user)
    if action:
        qs = qs.filter(action=action)
    since, until = date_param(request, "since"), date_param(request, "until")
    if since:
        qs = qs.filter(at__gte=since)
    if until and len(request.GET.get("until", "").strip()) <= 10:
        until = _day_after(until)  # a date: that whole day is included
    if until:
        qs = qs.filter(at__lt=until)
    before = int_param(request, "before", None, 1, 2**62)
    if before:
        qs = qs.filter(pk__lt=before)
    entries = list(qs.order_by("-pk")[:PAGE_SIZE + 1])
    more = len(entries) > PAGE_SIZE
    entries = entries[:PAGE_SIZE]
    params = {k: v for k, v in {"user": user, "action": action, "since": request.GET.get("since", ""),
                                "until": request.GET.get("until", "")}.items() if v}
    return page(request, "dashboard/audit.html", {
        "section": "audit", "entries": entries, "user": user, "action": action,
        "since": params.get("since", ""), "until": params.get("until", ""),
        "users": _choices("username", user, 200),
        "actions": _choices("action", action, 100),
        "next_url": f"?{urlencode({**params, 'before': entries[-1].pk})}" if more else "",
        "first_url": f"?{urlencode(params)}" if before else "",
    })
