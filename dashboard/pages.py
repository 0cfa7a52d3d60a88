"""Rendering a dashboard page: the layout's context (the role flag its buttons read) and the
readable error a request gets instead of a traceback, as a page or as an htmx fragment."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.security.permissions import can_act

#: Why a viewer's buttons are disabled (shown as their title and beside them).
VIEWER_REASON = "Your role is sluice-viewer: only sluice-operator users can act."


def is_htmx(request: HttpRequest) -> bool:
    """The request came from htmx (its ``HX-Request`` header), as django-htmx's middleware
    would say: read here so the dashboard needs no middleware of the host project's."""
    return request.headers.get("HX-Request") == "true"


def page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    """Render a page or partial with what the layout needs (the role flag for buttons)."""
    context = {
        "can_act": can_act(request.user),
        "viewer_reason": VIEWER_REASON,
        "now": timezone.now(),
        **context,
    }
    return render(request, template, context, status=status)


def error_response(request: HttpRequest, message: str, status: int = 400) -> HttpResponse:
    """A 4xx with a readable message (never a traceback): a page, or for htmx a fragment that
    goes into the layout's ``#flash`` region (base.html lets htmx swap error answers)."""
    if not is_htmx(request):
        return page(request, "dashboard/error.html", {"error": message, "status": status}, status=status)
    response = page(request, "dashboard/partials/error.html", {"error": message, "status": status}, status=status)
    response["HX-Retarget"] = "#flash"
    response["HX-Reswap"] = "innerHTML"
    return response
