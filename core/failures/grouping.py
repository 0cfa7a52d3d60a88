"""Grouping failures: exception type + the frame where it was raised."""
from __future__ import annotations

import hashlib
import re

PY_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<func>.+?)\s*$', re.MULTILINE)
NET_FRAME_RE = re.compile(r"^\s*at (?P<frame>.+?)(?: in .+)?\s*$", re.MULTILINE)


def first_frame(stack_trace: str) -> str:
    """The frame where the exception was raised, without line numbers (so edits elsewhere in a
    file do not split a group): ``dir/file.py:function`` for a Python traceback (its innermost
    frame), ``Namespace.Class.Method(args)`` for a .NET stack trace (its first ``at`` line).
    "" when there is none."""
    if not stack_trace:
        return ""
    frames = list(PY_FRAME_RE.finditer(stack_trace))
    if frames:
        last = frames[-1]  # innermost frame of the final exception (chained ones come first)
        parts = re.split(r"[\\/]", last.group("file"))
        return f"{'/'.join(parts[-2:])}:{last.group('func')}"
    match = NET_FRAME_RE.search(stack_trace)
    return match.group("frame").strip() if match else ""


def group_of(exception_type: str, stack_trace: str) -> tuple[str, str]:
    """(group_key, group_title) of a failure: exception type + the first stack frame."""
    frame = first_frame(stack_trace)
    exception_type = exception_type or "(no exception information)"
    title = f"{exception_type} @ {frame}" if frame else exception_type
    key = hashlib.sha1(f"{exception_type}\n{frame}".encode("utf-8")).hexdigest()[:16]
    return key, title[:500]
