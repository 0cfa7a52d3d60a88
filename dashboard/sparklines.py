"""Sparklines: the monitoring tab's small server-rendered SVG charts (one figure of one
queue over the period, no axes), with the period's deploy markers.  The big charts are
dashboard/svgchart.py's, whose axis rounding this shares."""
from __future__ import annotations

import datetime as dt
from typing import Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from dashboard.svgchart import _nice_max

WIDTH, HEIGHT, PAD = 160, 36, 2


def sparkline(label: str, points: Sequence[tuple[dt.datetime, float | None]], span: tuple[dt.datetime, dt.datetime],
              markers: Sequence[tuple[dt.datetime, str]] = (), color: str = "#2563eb") -> SafeString:
    """``points`` over ``span`` as a line (None breaks it), the top value in the title."""
    t0, t1 = span
    seconds = max((t1 - t0).total_seconds(), 1.0)
    values = [v for _, v in points if v is not None]
    top = _nice_max(max(values)) if values else 1.0

    def x(t: dt.datetime) -> float:
        return PAD + (t - t0).total_seconds() / seconds * (WIDTH - 2 * PAD)

    def y(v: float) -> float:
        return HEIGHT - PAD - v / top * (HEIGHT - 2 * PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" class="spark" role="img" '
             f'aria-label="{escape(label)}"><title>{escape(label)}</title>']
    for at, text in markers:
        if t0 <= at <= t1:
            parts.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="0" y2="{HEIGHT}" class="deploy">'
                         f'<title>deploy {escape(text)}</title></line>')
    runs: list[list[str]] = [[]]
    for t, v in points:
        if v is None:
            runs.append([])
        else:
            runs[-1].append(f"{x(t):.1f},{y(v):.1f}")
    for run in runs:
        if len(run) == 1:
            cx, cy = run[0].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" fill="{color}"/>')
        elif run:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.4" points="{" ".join(run)}"/>')
    if not values:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2 + 4}" text-anchor="middle" class="empty">no data</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
