"""Every API error as ``{"error": "..."}`` with a 4xx/5xx status, never a traceback page."""
from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from dashboard.actions import ActionError
from dashboard.security.middleware import is_api_request

log = logging.getLogger("sluice.api")


def _text(detail: Any) -> str:
    """DRF's nested error details flattened into one readable line."""
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_text(v)}" if k != "non_field_errors" else _text(v) for k, v in detail.items())
    if isinstance(detail, (list, tuple)):
        return "; ".join(_text(v) for v in detail)
    return str(detail)


@csrf_exempt  # it changes nothing: a POST gets the same 404, not an HTML CSRF page
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any path under /api/ that names no endpoint, for every method: JSON, like the rest."""
    return JsonResponse({"error": f"no API endpoint at {request.path[:200]}"}, status=404)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 handler (sluice/urls.py): JSON under /api/ also for paths no URL pattern
    can match at all (a path with a line break escapes even ``api/<path:rest>``)."""
    if is_api_request(request):
        return not_found(request)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's 500 handler (sluice/urls.py): JSON under /api/, the error page elsewhere."""
    if is_api_request(request):
        return JsonResponse({"error": "internal error"}, status=500)
    return defaults.server_error(request)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ActionError):
        return Response({"error": exc.message}, status=exc.status)
    if isinstance(exc, exceptions.ParseError):
        return Response({"error": f"malformed JSON: {_text(exc.detail)}"}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, (Http404, exceptions.NotFound)):
        return Response({"error": _text(getattr(exc, "detail", "")) or "not found"}, status=404)
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is not None:
        body = {"error": _text(response.data.get("detail", response.data)
                               if isinstance(response.data, dict) else response.data)}
        response.data = body
        return response
    if isinstance(exc, RequestDataTooBig):
        return Response({"error": "the request body is too large"}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, SuspiciousOperation):
        return Response({"error": f"bad request: {exc}"[:300]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DatabaseError):
        log.warning("API request failed on the database: %s", exc)
        return Response({"error": f"database error: {str(exc).splitlines()[0][:300]}"}, status=503)
    log.exception("unexpected API error", exc_info=exc)
    return Response({"error": f"internal error: {type(exc).__name__}"}, status=500)
