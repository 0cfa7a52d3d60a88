"""Response headers every answer carries that Django and django-csp do not set, the API's
refusal of query parameters no database could take, and where a request falls in the
dashboard (mounted under any prefix, behind any ``SCRIPT_NAME``)."""
from __future__ import annotations

from typing import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse


def dashboard_path(request: HttpRequest) -> str | None:
    """The request's path below the dashboard's mount point (``"api/queues/"``; ``""`` for the
    overview), or None for a path of the host project's own.  The mount point is wherever the
    project ``include()``-d ``dashboard.urls``, with the script prefix a proxy sets."""
    try:
        root = reverse("dashboard:overview")
    except NoReverseMatch:  # the dashboard's URLs are not mounted: nothing is ours
        return None
    return request.path[len(root):] if request.path.startswith(root) else None


def is_api_request(request: HttpRequest) -> bool:
    """A request for the JSON API (``<mount>/api/…``): its errors are JSON too."""
    below = dashboard_path(request)
    return below is not None and below.startswith("api/")


def security_headers(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """``Permissions-Policy``: the browser features no page uses are off, so a script that
    slipped in anyway cannot reach the camera, the location or the payment sheet."""
    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        response.headers.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        return response

    return middleware


def api_query_without_nul(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable[[HttpRequest], HttpResponse]:
    """A NUL character in an API query parameter is refused with 400 before any view runs:
    no parameter can hold one, and PostgreSQL refuses it in text (a 503 otherwise)."""
    def middleware(request: HttpRequest) -> HttpResponse:
        if is_api_request(request) and any(
                "\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()):
            return JsonResponse({"error": "query parameters must not contain NUL characters"}, status=400)
        return get_response(request)

    return middleware
