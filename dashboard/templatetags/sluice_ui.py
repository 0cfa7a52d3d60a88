"""Template helpers of the dashboard pages: relative times with the UTC time beside them,
sizes, ages.  Every value passes through Django's escaping (format_html), never |safe."""
from __future__ import annotations

import datetime as dt

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()


def _span(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f} {unit}" if value >= 10 or unit == "min" else f"{value:.1f} {unit}"
    return f"{seconds:.0f} s"


@register.simple_tag
def ago(value: dt.datetime | None, now: dt.datetime | None = None):
    """``<time>`` with "3 min ago" / "in 5 min" and the UTC ISO time in its title (so it can be
    matched with logs, which are in UTC)."""
    if value is None:
        return "—"
    now = now or timezone.now()
    if timezone.is_naive(value):
        value = timezone.make_aware(value, dt.timezone.utc)
    iso = value.astimezone(dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    delta = (now - value).total_seconds()
    span = _span(delta)
    text = span if span == "now" else (f"{span} ago" if delta >= 0 else f"in {span}")
    return format_html('<time datetime="{}" title="{} UTC">{}</time>', iso, iso.replace("T", " ").rstrip("Z"), text)


@register.filter
def utc(value: dt.datetime | None) -> str:
    """Absolute UTC time for detail pages."""
    if value is None:
        return "—"
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@register.filter
def age(seconds: float | None) -> str:
    """A duration in seconds, short ("4.2 min"); "—" when unknown."""
    if seconds is None:
        return "—"
    return _span(seconds) if seconds >= 1 else f"{seconds:.1f} s"


@register.filter
def size(n: int | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@register.filter
def percent(value: float | None) -> int:
    return int(round((value or 0) * 100))


#: The theme toggle's cookie (dashboard/static/dashboard/theme.js): "light" or "dark"; absent,
#: the page follows the system's prefers-color-scheme.
THEME_COOKIE = "sluice_theme"


@register.simple_tag(takes_context=True)
def theme_attribute(context) -> str:
    """`` data-theme="dark"`` on <html> when the visitor chose a theme: drawn by the server,
    so the first paint is already in it (an inline script could do it only with a nonce)."""
    request = context.get("request")
    theme = request.COOKIES.get(THEME_COOKIE) if request is not None else None
    return format_html(' data-theme="{}"', theme) if theme in ("light", "dark") else ""
