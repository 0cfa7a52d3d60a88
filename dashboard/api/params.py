"""What the API's views share: query parameters read with clear errors, the JSON object a
write must send, and an operator action answered (the overview's snapshot forgotten)."""
from __future__ import annotations

import datetime as dt
from typing import Any, Callable

from rest_framework import parsers, status
from rest_framework.exceptions import ParseError
from rest_framework.request import Request
from rest_framework.response import Response

from dashboard import actions
from dashboard.actions import ActionError
from dashboard.actions.validate import MAX_JSON_DEPTH, too_deep
from dashboard.counting import stats

#: Rows a list returns at most (``limit`` is clamped to this).
MAX_LIMIT = 500
#: Failed-message searches count matches up to this many ("count_capped": true beyond).
COUNT_CAP = 10_000


def int_param(request: Request, name: str, default: int, low: int = 1, high: int = MAX_LIMIT) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ActionError(f"{name} must be a whole number, not {raw[:40]!r}") from None
    if not low <= value <= high:
        raise ActionError(f"{name} must be between {low} and {high}")
    return value


def time_param(request: Request, name: str) -> dt.datetime | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
        # In UTC: an offset such as -23:45 is valid ISO 8601 but out of PostgreSQL's range.
        return value.astimezone(dt.timezone.utc) if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    except (ValueError, OverflowError):
        raise ActionError(f"{name} must be an ISO 8601 time, not {raw[:40]!r}") from None


def request_object(request: Request) -> dict[str, Any]:
    data = request.data
    if not isinstance(data, dict):
        raise ActionError("the request body must be a JSON object")
    return data


def act(fn: Callable[[], actions.ActionResult], make: Callable[[actions.ActionResult], dict],
         code: int = status.HTTP_200_OK) -> Response:
    result = fn()
    stats.forget_snapshot()  # the next overview shows the change (throughput samples stay)
    return Response(make(result), status=code)


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, whose RecursionError (``[`` × 100,000) was a 500: a body nested past
    what Python parses, or past MAX_JSON_DEPTH (deeper than any request needs, and every
    later walk of it would recurse as deep), is a 400 like any malformed body."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
        if too_deep(data):
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        return data
