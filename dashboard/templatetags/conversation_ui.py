"""Template filters of the conversation view: record times are integer microseconds."""
from __future__ import annotations

from django import template

from core.records.conversations import time_of
from dashboard.conversation.svg import duration_text

register = template.Library()


@register.filter
def us_duration(value: int | None) -> str:
    """A duration in µs as "850 µs", "12.3 ms" or "4.2 s" ("—" when unknown)."""
    return "—" if value is None else duration_text(value)


@register.filter
def us_time(value: int | None) -> str:
    """A time in µs since the epoch as UTC with milliseconds ("—" when unknown)."""
    if value is None:
        return "—"
    return time_of(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
