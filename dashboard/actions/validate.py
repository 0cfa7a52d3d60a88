"""Input checks shared by the actions: each raises ActionError with a message for people."""
from __future__ import annotations

import json
from typing import Any

from core.errors import InvalidQueueName, UnknownQueue
from core.queues import QueueInfo, registry

from dashboard.actions.errors import ActionError

#: Most ids one request may name (bigger selections use a group or "all").
MAX_IDS = 10_000
MAX_ID_LENGTH = 250


def queue(name: Any, using: str | None = None) -> QueueInfo:
    """The registered queue called ``name``; ActionError 404 when there is none."""
    if not isinstance(name, str) or not name:
        raise ActionError("a queue name is required")
    try:
        return registry.get(name, using)
    except InvalidQueueName as exc:
        raise ActionError(f"unknown queue {name!r}: {exc}", 404) from None
    except UnknownQueue:
        raise ActionError(f"unknown queue {name!r}", 404) from None


def _id_list(ids: Any, what: str) -> list[Any]:
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)):
        raise ActionError(f"{what} must be a list")
    if not ids:
        raise ActionError(f"no {what} given")
    if len(ids) > MAX_IDS:
        raise ActionError(f"at most {MAX_IDS} {what} at once; use a group or 'all' for more")
    return list(ids)


def string_ids(ids: Any, what: str = "message ids") -> list[str]:
    """A non-empty list of distinct, non-empty, printable ids (order kept)."""
    out = []
    for value in _id_list(ids, what):
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_ID_LENGTH \
                or any(ord(c) < 32 for c in value):
            raise ActionError(f"malformed id in {what}: {str(value)[:80]!r}")
        out.append(value)
    return list(dict.fromkeys(out))


def int_ids(ids: Any, what: str = "ids") -> list[int]:
    """A non-empty list of distinct positive integers (ints or digit strings)."""
    out = []
    for value in _id_list(ids, what):
        if isinstance(value, bool):
            raise ActionError(f"malformed id in {what}: {value!r}")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if not isinstance(value, int) or value < 1 or value > 2**63 - 1:
            raise ActionError(f"malformed id in {what}: {str(value)[:80]!r}")
        out.append(value)
    return list(dict.fromkeys(out))


def number(value: Any, what: str, minimum: float = 0, maximum: float = 36500) -> float:
    if isinstance(value, bool):
        raise ActionError(f"{what} must be a number")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ActionError(f"{what} must be a number, not {str(value)[:40]!r}") from None
    if not minimum <= result <= maximum:
        raise ActionError(f"{what} must be between {minimum:g} and {maximum:g}")
    return result


#: The deepest JSON an operator's request may nest (an alerts configuration needs 5 levels).
MAX_JSON_DEPTH = 32


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether parsed JSON nests past ``limit`` levels (looked at without recursion: what is
    checked may be as deep as the parser allowed, and every later walk of it, from
    validation to repr() in an audit entry, would recurse that deep)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def load_json(text: str | bytes, what: str) -> Any:
    """An operator's JSON text parsed, or ActionError saying why not: not JSON, nested
    deeper than MAX_JSON_DEPTH (or than Python can parse), or a number Python will not load."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ActionError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise ActionError(f"{what} is not JSON: {str(exc)[:200]}") from None
    if too_deep(value):
        raise ActionError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    return value
