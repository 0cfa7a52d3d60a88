"""The conversation view's pictures, as server-rendered SVG (no JavaScript, colours as SVG
attributes, which the CSP allows): a timeline (where each message's time went: delay asked
for, queue wait, processing) and a sequence diagram with the queues as lifelines.

Each message is one row, in the order it was first seen; its label links to ``links[id]``
(the failed-message page, or its row in the flow)."""
from __future__ import annotations

from typing import Mapping, Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from core.records.conversations import Node

ROW = 20
TOP = 34
LABEL_W = 230
PLOT_W = 700
LANE_W = 170
#: CSS variables (dashboard/static/dashboard/sluice.css): each theme has its own colours.  They
#: go into style attributes, which outrank the stylesheet's defaults for SVG text.
COLORS = {"delay": "var(--flow-delay)", "wait": "var(--flow-wait)", "processing": "var(--flow-processing)",
          "failed": "var(--bad)", "retry": "var(--flow-retry)", "line": "var(--flow-line)", "text": "var(--fg)"}
SKEW_MARK = "⚠ clock skew"


def duration_text(us: int | None) -> str:
    """A duration in µs as "850 µs", "12.3 ms" or "4.2 s" (the pages' and the pictures' one way)."""
    if us is None:
        return "unknown"
    if abs(us) < 1000:
        return f"{us} µs"
    if abs(us) < 10_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1_000_000:.1f} s"


def _label(node: Node, width: int = 30) -> str:
    text = node.message_type or node.message_id
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _link(text: str, href: str, x: float, y: float, anchor: str = "start", color: str = COLORS["text"]) -> str:
    return (f'<a href="{escape(href)}"><text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" style="fill:{color}">'
            f'{escape(text)}</text></a>')


def timeline(nodes: Sequence[Node], links: Mapping[str, str]) -> SafeString:
    """One bar per message on a shared time axis: grey the delay a delayed send asked for,
    amber the queue wait, blue processing (red when it failed).  A negative duration (the
    sender's and the worker's clocks disagree) is not drawn: the row says so."""
    times = [t for n in nodes for t in (n.time_sent_us, n.available_us, n.started_us, n.ended_us,
                                        n.time_of_failure_us) if t is not None]
    height = TOP + ROW * max(len(nodes), 1) + 30
    width = LABEL_W + PLOT_W + 110
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" class="conversation-timeline" aria-label="Timeline">'
             '<title>Timeline: delay, queue wait and processing of each message</title>']
    if not times:
        parts.append(f'<text x="{LABEL_W}" y="{TOP}">no timestamps</text></svg>')
        return mark_safe("".join(parts))
    t0, t1 = min(times), max(times)
    span = max(t1 - t0, 1)

    def x(t: int) -> float:
        return LABEL_W + (t - t0) / span * PLOT_W

    for i in range(5):  # the axis: offsets from the first timestamp
        at = t0 + span * i // 4
        parts.append(f'<line x1="{x(at):.1f}" x2="{x(at):.1f}" y1="{TOP - 8}" y2="{height - 26}" '
                     f'style="stroke:var(--chart-grid)"/><text x="{x(at):.1f}" y="{TOP - 14}" text-anchor="middle" '
                     f'font-size="11">+{escape(duration_text(at - t0))}</text>')
    for row, node in enumerate(nodes):
        y = TOP + row * ROW
        parts.append(f'<g data-message="{escape(node.message_id)}">')
        parts.append(_link(_label(node), links.get(node.message_id, "#"), LABEL_W - 8, y + 13, "end",
                           COLORS["failed"] if node.failed else COLORS["text"]))
        segments = [("delay", node.time_sent_us, node.deliver_at_us, "delayed"),
                    ("wait", node.available_us, node.started_us, "queue wait"),
                    ("failed" if node.failed else "processing", node.started_us, node.ended_us, "processing")]
        for kind, start, end, name in segments:
            if start is None or end is None or end < start:
                continue
            parts.append(f'<rect x="{x(start):.1f}" y="{y + 4}" width="{max(x(end) - x(start), 1.5):.1f}" '
                         f'height="{ROW - 8}" style="fill:{COLORS[kind]}" data-segment="{kind}">'
                         f'<title>{escape(name)}: {escape(duration_text(end - start))}</title></rect>')
        if node.started_us is None and node.time_of_failure_us is not None:
            fx = x(node.time_of_failure_us)
            parts.append(f'<path d="M{fx:.1f},{y + 3} l5,7 l-5,7 l-5,-7 z" style="fill:{COLORS["failed"]}">'
                         f'<title>failed ({escape(node.exception_type or "error queue")})</title></path>')
        if node.skewed:
            parts.append(f'<text x="{LABEL_W + PLOT_W + 6}" y="{y + 13}" style="fill:{COLORS["failed"]}" '
                         f'data-skew="1">{SKEW_MARK}</text>')
        parts.append("</g>")
    legend_y = height - 10
    for i, (kind, text) in enumerate((("delay", "delayed"), ("wait", "queue wait"),
                                      ("processing", "processing"), ("failed", "failed"))):
        lx = LABEL_W + i * 120
        parts.append(f'<rect x="{lx}" y="{legend_y - 9}" width="12" height="10" style="fill:{COLORS[kind]}"/>'
                     f'<text x="{lx + 16}" y="{legend_y}" font-size="11">{text}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))


def lanes_of(nodes: Sequence[Node]) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """The lifelines (queues, in order of first use) and each message's (from, to) lanes:
    from its parent's queue when the parent is on the page, else its originating endpoint."""
    by_id = {n.message_id: n for n in nodes}
    lanes: list[str] = []
    ends: dict[str, tuple[str, str]] = {}
    for node in nodes:
        parent = by_id.get(node.related_to)
        source = parent.queue if parent is not None and parent.queue else (
            f"{node.originating_endpoint or 'unknown'} (sender)")
        target = node.queue or "(unknown queue)"
        for lane in (source, target):
            if lane not in lanes:
                lanes.append(lane)
        ends[node.message_id] = (source, target)
    return lanes, ends


def sequence(nodes: Sequence[Node], links: Mapping[str, str]) -> SafeString:
    """Queues as lifelines, one arrow per message from the lane that sent it to the queue
    that handled it, in the order they were first seen; replies dashed, failures red."""
    lanes, ends = lanes_of(nodes)
    width = max(len(lanes), 1) * LANE_W + 40
    height = TOP + 20 + ROW * 1.5 * max(len(nodes), 1) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0f}" width="{width}" '
             f'height="{height:.0f}" role="img" class="conversation-sequence" aria-label="Sequence">'
             '<title>Sequence: queues as lifelines</title>'
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" style="fill:{COLORS["line"]}"/></marker></defs>']
    lane_x = {lane: 20 + LANE_W * i + LANE_W / 2 for i, lane in enumerate(lanes)}
    for lane, lx in lane_x.items():
        name = lane if len(lane) <= 24 else "…" + lane[-23:]
        parts.append(f'<g data-lane="{escape(lane)}"><rect x="{lx - LANE_W / 2 + 6:.1f}" y="4" width="{LANE_W - 12}" '
                     f'height="22" rx="3" style="fill:var(--flow-box);stroke:{COLORS["line"]}"/>'
                     f'<text x="{lx:.1f}" y="19" text-anchor="middle" font-size="12">{escape(name)}</text>'
                     f'<line x1="{lx:.1f}" x2="{lx:.1f}" y1="26" y2="{height - 6:.0f}" style="stroke:{COLORS["line"]}" '
                     'stroke-dasharray="4 4"/></g>')
    for row, node in enumerate(nodes):
        y = TOP + 20 + row * ROW * 1.5
        source, target = ends[node.message_id]
        x1, x2 = lane_x[source], lane_x[target]
        color = COLORS["failed"] if node.failed else (COLORS["retry"] if node.intent == "retry" else COLORS["line"])
        dash = ' stroke-dasharray="6 3"' if node.intent == "reply" else ""
        parts.append(f'<g data-message="{escape(node.message_id)}">')
        if x1 == x2:  # sent to its own queue: a loop on the lifeline
            parts.append(f'<path d="M{x1:.1f},{y - 8:.1f} h26 v12 h-24" fill="none" style="stroke:{color}" '
                         f'stroke-width="1.5"{dash} marker-end="url(#arrow)"/>')
            tx, anchor = x1 + 30, "start"
        else:
            end = x2 - 5 if x2 > x1 else x2 + 5
            parts.append(f'<line x1="{x1:.1f}" y1="{y:.1f}" x2="{end:.1f}" y2="{y:.1f}" style="stroke:{color}" '
                         f'stroke-width="1.5"{dash} marker-end="url(#arrow)"/>')
            tx, anchor = (x1 + x2) / 2, "middle"
        parts.append(f'<rect x="{x2 - 4:.1f}" y="{y - 6:.1f}" width="8" height="12" style="fill:{color}"/>')
        what = _label(node, 26) + ("" if node.intent in ("", "send") else f" ({node.intent})")
        parts.append(_link(what, links.get(node.message_id, "#"), tx, y - 5, anchor, color))
        parts.append("</g>")
    parts.append("</svg>")
    return mark_safe("".join(parts))
