"""What every dashboard page shares: rendering with the viewer/operator flag, turning an
action's outcome into a response, message bodies for display, bounded GET parameters."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Callable

from functools import wraps

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.counting import stats
from dashboard.actions import ActionError, ActionResult
from dashboard.actions.audit import OPERATORS_ONLY, record_denial
from dashboard.pages import VIEWER_REASON, error_response, is_htmx, page  # noqa: F401 (the views import them from here)
from dashboard.security.permissions import can_act, can_view, to_login

#: Bodies longer than this are cut on the page (the whole body is a download away).
BODY_DISPLAY_LIMIT = 64 * 1024
def operator_only(action: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """For a view that acts: GET and HEAD need the viewer role; any other method the operator
    role, checked before the form is read, so a viewer's forged post is a 403 (and audited
    as ``action``) whatever it holds.  Anonymous users go to the login page."""
    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return to_login(request)
            safe = request.method in ("GET", "HEAD")
            if not (can_view(request.user) if safe else can_act(request.user)):
                if not safe:
                    record_denial(request.user, action, "web", target=request.path)
                return error_response(request, OPERATORS_ONLY if can_view(request.user) else
                                      "Your account has no Sluice role; ask an operator for sluice-viewer.", 403)
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def act(request: HttpRequest, call: Callable[[], ActionResult], redirect_to: str) -> HttpResponse:
    """Run one dashboard.actions call for a form post: its message is flashed and the browser
    goes back to ``redirect_to`` (303; htmx: HX-Redirect); bad input gives a 4xx page with the
    reason, a role that may not act a 403 — the action itself checks and audits both."""
    try:
        result = call()
    except PermissionDenied as exc:
        return error_response(request, str(exc) or VIEWER_REASON, 403)
    except ActionError as exc:
        return error_response(request, exc.message, exc.status)
    stats.forget_snapshot()  # the pages after an action show its effect
    messages.success(request, result.message[:1].upper() + result.message[1:] + ".")
    if is_htmx(request):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = redirect_to
        return response
    return HttpResponseRedirect(redirect_to, status=303)


def back_to(request: HttpRequest, default: str) -> str:
    """Where a form's ``next`` field says to go after the action: a path on this site only
    (Django's own check, which also knows "/\\evil.example" and control characters)."""
    nxt = request.POST.get("next", "")
    safe = nxt.startswith("/") and url_has_allowed_host_and_scheme(nxt, allowed_hosts=None)
    return nxt if safe else default


def int_param(request: HttpRequest, name: str, default: int | None, low: int, high: int) -> int | None:
    """A GET parameter as an int clamped to [low, high]; the default when absent or not a number."""
    raw = request.GET.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        return default
    return max(low, min(high, value))


def date_param(request: HttpRequest, name: str) -> dt.datetime | None:
    """A ``YYYY-MM-DD`` (or ISO time) GET parameter as an aware UTC datetime; None when absent or bad."""
    return parse_date(request.GET.get(name, ""))


def parse_date(raw: str) -> dt.datetime | None:
    """``YYYY-MM-DD`` (or an ISO time) as an aware UTC datetime; None when empty or bad."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = dt.datetime.fromisoformat(raw)
        # In UTC: an offset such as +19:25 is valid ISO 8601 but out of PostgreSQL's range.
        return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True)
class BodyView:
    """A message body ready for a page: text (pretty JSON when it parses), or a hex preview."""

    text: str | None
    is_json: bool
    truncated: bool
    size: int
    hex_preview: str | None = None


def body_view(body: bytes | memoryview | None, limit: int = BODY_DISPLAY_LIMIT) -> BodyView:
    data = bytes(body or b"")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        preview = data[:512].hex(" ")
        return BodyView(None, False, len(data) > 512, len(data), preview)
    is_json = False
    if len(data) <= 4 * limit:
        try:
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            is_json = True
        except (ValueError, RecursionError):  # deep nesting: shown as the text it is
            pass
    truncated = len(text) > limit
    return BodyView(text[:limit] if truncated else text, is_json, truncated, len(data))


def download(body: bytes | memoryview | None, filename: str) -> HttpResponse:
    """A body as an attachment, never rendered by the browser (octet-stream + nosniff)."""
    response = HttpResponse(bytes(body or b""), content_type="application/octet-stream")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in filename)[:100] or "body"
    response["Content-Disposition"] = f'attachment; filename="{safe}.bin"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


def ordered_headers(headers: dict[str, str], pinned: tuple[str, ...]) -> list[tuple[str, str]]:
    """Headers with the well-known ones first (id, type, sent time, failed queue…), then by name."""
    first = [(k, headers[k]) for k in pinned if k in headers]
    rest = sorted((k, v) for k, v in headers.items() if k not in pinned)
    return first + rest
