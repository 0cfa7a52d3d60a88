"""Server-rendered SVG line charts (no JavaScript, no chart library to serve)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable, Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 26, 34


@dataclass
class Series:
    label: str
    color: str
    points: Sequence[tuple[dt.datetime, float | None]]


def _nice_max(value: float) -> float:
    """A round upper bound for the y axis (1, 2, 2.5 or 5 × a power of ten)."""
    if value <= 0:
        return 1.0
    power = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    while power > value:
        power /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def line_chart(title: str, series: Sequence[Series], y_format: Callable[[float], str] = "{:g}".format,
               width: int = WIDTH, height: int = HEIGHT, span: tuple[dt.datetime, dt.datetime] | None = None,
               markers: Sequence[tuple[dt.datetime, str]] = ()) -> SafeString:
    """An SVG chart of ``series`` over time; a gap (None, or no point for a window) breaks
    the line, so an idle minute is not drawn as a slope.  ``span`` fixes the time axis
    (default: the points' first to last); ``markers`` (time, label) are drawn as labelled
    vertical lines (deploys)."""
    values = [v for s in series for _, v in s.points if v is not None]
    times = [t for s in series for t, _ in s.points] + list(span or ())
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
             f'class="chart" aria-label="{escape(title)}"><title>{escape(title)}</title>'
             f'<text x="{LEFT}" y="14" class="caption">{escape(title)}</text>']
    if not values:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="empty">no data</text></svg>')
        return mark_safe("".join(parts))
    t0, t1 = span or (min(times), max(times))
    seconds = max((t1 - t0).total_seconds(), 1.0)
    top = _nice_max(max(values))
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM

    def x(t: dt.datetime) -> float:
        return LEFT + (t - t0).total_seconds() / seconds * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    for i in range(5):  # grid and y labels
        v = top * i / 4
        parts.append(f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" class="grid"/>'
                     f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{escape(y_format(v))}</text>')
    for i in range(4):  # time labels (UTC)
        t = t0 + dt.timedelta(seconds=seconds * i / 3)
        anchor = "start" if i == 0 else ("end" if i == 3 else "middle")
        parts.append(f'<text x="{x(t):.1f}" y="{height - 14}" text-anchor="{anchor}">{t:%H:%M}</text>')
    step = min((b[0] - a[0]).total_seconds() for s in series for a, b in zip(s.points, s.points[1:])
               ) if any(len(s.points) > 1 for s in series) else seconds
    for s in series:
        runs, current, previous = [], [], None
        for t, v in s.points:
            if v is None or (previous is not None and (t - previous).total_seconds() > step * 1.5):
                if current:
                    runs.append(current)
                current = []
            if v is not None:
                current.append(f"{x(t):.1f},{y(v):.1f}")
            previous = t
        if current:
            runs.append(current)
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2" style="fill:{s.color}"/>')
            else:
                parts.append(f'<polyline fill="none" style="stroke:{s.color}" stroke-width="1.6" points="{" ".join(run)}"/>')
    for at, label in markers:
        if t0 <= at <= t1:
            parts.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{TOP}" y2="{height - BOTTOM}" class="deploy">'
                         f'<title>deploy {escape(label)} at {at:%H:%M:%S} UTC</title></line>'
                         f'<text x="{x(at) + 3:.1f}" y="{TOP + 9}" class="deploy-label">{escape(label[:24])}</text>')
    for i, s in enumerate(series):  # legend
        lx = LEFT + i * 110
        parts.append(f'<rect x="{lx}" y="{height - 10}" width="10" height="3" style="fill:{s.color}"/>'
                     f'<text x="{lx + 14}" y="{height - 6}">{escape(s.label)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))
