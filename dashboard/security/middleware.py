"""Response headers every answer carries that Django and django-csp do not set, and the API's
refusal of query parameters no database could take."""
from __future__ import annotations

from typing import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


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
        if request.path.startswith("/api/") and any(
                "\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()):
            return JsonResponse({"error": "query parameters must not contain NUL characters"}, status=400)
        return get_response(request)

    return middleware
