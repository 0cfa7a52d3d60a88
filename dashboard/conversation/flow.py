"""The conversation view's flow tree as rows for the page: each message under the one whose
handler sent it, indented by depth, and (collapsed by message type) many siblings of one
type folded into a single row that still shows its failed members, so a retry stays one
click away.  Built with a stack, not recursion: a chain of 10,000 messages is 10,000 deep."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence, Union

from core.records.conversations import Node

#: Siblings of one message type folded into one row from this many on.
COLLAPSE_AT = 5
#: Indentation stops growing here (the row says its depth past it).
MAX_INDENT = 24


@dataclass
class FlowRow:
    depth: int
    node: Node | None = None
    #: A folded group of siblings (node is None): their type, how many, how many failed.
    group_type: str = ""
    group_count: int = 0
    group_failed: int = 0
    #: The group's failed members, drawn below it (with what they caused).
    shown: list[Node] = field(default_factory=list)
    #: The row's id on the page (the pictures' labels link to it); set by the view.
    anchor: str = ""

    @property
    def indent(self) -> float:
        return min(self.depth, MAX_INDENT) * 1.25

    @property
    def deep(self) -> bool:
        return self.depth > MAX_INDENT


Item = Union[Node, FlowRow]


def _siblings(nodes: Sequence[Node], collapse: bool) -> list[Item]:
    if not collapse:
        return list(nodes)
    counts = Counter(n.message_type for n in nodes)
    out: list[Item] = []
    groups: dict[str, FlowRow] = {}
    for node in nodes:
        if counts[node.message_type] < COLLAPSE_AT:
            out.append(node)
            continue
        group = groups.get(node.message_type)
        if group is None:
            group = groups[node.message_type] = FlowRow(0, group_type=node.message_type or "(no type)")
            out.append(group)
        group.group_count += 1
        if node.failed:
            group.group_failed += 1
            group.shown.append(node)
    return out


def flow_rows(roots: Sequence[Node], collapse: bool = True) -> list[FlowRow]:
    """The tree under ``roots`` in drawing order (depth first, oldest sibling first)."""
    rows: list[FlowRow] = []
    stack: list[tuple[Item, int]] = [(item, 0) for item in reversed(_siblings(roots, collapse))]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, FlowRow):
            item.depth = depth
            rows.append(item)
            stack.extend((member, depth + 1) for member in reversed(item.shown))
            continue
        rows.append(FlowRow(depth, node=item))
        stack.extend((child, depth + 1) for child in reversed(_siblings(item.children, collapse)))
    return rows
