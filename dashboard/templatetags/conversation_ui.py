"""Template filters of the conversation view: record times are integer microseconds."""
from __future__ import annotations

import datetime as dt

from django import template

register = template.Library()


@register.filter
def us_duration(value: int | None) -> str:
    """A duration in µs as "850 µs", "12.3 ms" or "4.2 s" ("—" when unknown)."""
    if value is None:
        return "—"
    if abs(value) < 1000:
        return f"{value} µs"
    if abs(value) < 10_000_000:
        return f"{value / 1000:.1f} ms"
    return f"{value / 1_000_000:.1f} s"


@register.filter
def us_time(value: int | None) -> str:
    """A time in µs since the epoch as UTC with milliseconds ("—" when unknown)."""
    if value is None:
        return "—"
    when = dt.datetime.fromtimestamp(value // 1_000_000, dt.timezone.utc).replace(microsecond=value % 1_000_000)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
