"""Sparklines: the monitoring tab's small server-rendered SVG charts (one figure of one
queue over the period, no axes), with the period's deploy markers.  The big charts are
dashboard/charts/svgchart.py's, whose axis rounding this shares."""
from __future__ import annotations

import datetime as dt
import html
from typing import Sequence

from django.utils.safestring import SafeString, mark_safe

from dashboard.charts.svgchart import _nice_max

WIDTH, HEIGHT, PAD = 160, 36, 2


def sparkline(label: str, points: Sequence[tuple[dt.datetime, float | None]], span: tuple[dt.datetime, dt.datetime],
              markers: Sequence[tuple[dt.datetime, str]] = (), color: str = "var(--chart-blue)") -> SafeString:
    """``points`` over ``span`` as a line (None breaks it), the top value in the title."""
    scale = Scale(span)
    return spark_svg(label, [scale.x(t) for t, _ in points], [v for _, v in points], scale.markers(markers), color)


class Scale:
    """Where times fall across a sparkline: worked out once for every sparkline of a page
    (the monitoring tab draws five per queue over the same buckets)."""

    def __init__(self, span: tuple[dt.datetime, dt.datetime]) -> None:
        self.t0, self.t1 = span
        self.seconds = max((self.t1 - self.t0).total_seconds(), 1.0)

    def x(self, t: dt.datetime) -> float:
        return PAD + (t - self.t0).total_seconds() / self.seconds * (WIDTH - 2 * PAD)

    def markers(self, markers: Sequence[tuple[dt.datetime, str]]) -> list[tuple[float, str]]:
        """The markers within the span, as (x, label)."""
        return [(self.x(at), text) for at, text in markers if self.t0 <= at <= self.t1]


def spark_svg(label: str, xs: Sequence[float], values: Sequence[float | None],
              markers: Sequence[tuple[float, str]] = (), color: str = "var(--chart-blue)") -> SafeString:
    """The SVG of :func:`sparkline` from x positions already worked out (:class:`Scale`)."""
    present = [v for v in values if v is not None]
    top = _nice_max(max(present)) if present else 1.0
    span_y = (HEIGHT - 2 * PAD) / top
    # The standard library's escape: Django's (lazy-aware) one cost more than the drawing.
    label = html.escape(label)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" class="spark" role="img" '
             f'aria-label="{label}"><title>{label}</title>']
    for x, text in markers:
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{HEIGHT}" class="deploy">'
                     f'<title>deploy {html.escape(text)}</title></line>')
    runs: list[list[str]] = [[]]
    for x, v in zip(xs, values):
        if v is None:
            runs.append([])
        else:
            runs[-1].append(f"{x:.1f},{HEIGHT - PAD - v * span_y:.1f}")
    for run in runs:
        if len(run) == 1:
            cx, cy = run[0].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" style="fill:{color}"/>')
        elif run:
            parts.append(f'<polyline fill="none" style="stroke:{color}" stroke-width="1.4" points="{" ".join(run)}"/>')
    if not present:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2 + 4}" text-anchor="middle" class="empty">no data</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
