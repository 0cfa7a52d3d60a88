"""Cursor pagination for the API's lists ordered newest first by (time, id): the cursor is
the last row's time and id, opaque to clients, so a page never repeats or skips a row while
new rows arrive at the top (an offset would)."""
from __future__ import annotations

import base64
import binascii
import datetime as dt
from typing import Any, Sequence

from django.db.models import Q, QuerySet

from dashboard.actions import ActionError


def encode(at: dt.datetime, pk: int) -> str:
    return base64.urlsafe_b64encode(f"{at.isoformat()}|{pk}".encode()).decode("ascii").rstrip("=")


def decode(raw: str) -> tuple[dt.datetime, int]:
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8")
        at, pk = text.split("|")
        when = dt.datetime.fromisoformat(at)
        return (when.astimezone(dt.timezone.utc) if when.tzinfo else when), int(pk)
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise ActionError("cursor is not one this API gave out (pass next_cursor as it came)") from None


def page(qs: QuerySet, cursor: str | None, time_field: str, limit: int) -> tuple[list[Any], str | None]:
    """Up to ``limit`` rows of ``qs`` (ordered by ``-time_field, -pk``) after ``cursor``, and
    the cursor of the next page (None when this one is the last)."""
    if cursor:
        at, pk = decode(cursor)
        qs = qs.filter(Q(**{f"{time_field}__lt": at}) | Q(**{time_field: at, "pk__lt": pk}))
    rows: Sequence[Any] = list(qs[:limit + 1])
    if len(rows) <= limit:
        return list(rows), None
    last = rows[limit - 1]
    return list(rows[:limit]), encode(getattr(last, time_field), last.pk)
