"""Selections of failed messages, for retry and archive::

    ["id-1", "id-2"]                          # these message ids
    {"ids": [...]}                            # the same
    {"group": "<group_key>"}                  # one group's unresolved records
    {"all": True, "queue": "orders", "message_type": "PlaceOrder"}   # every unresolved one (filters optional)
    {"group": "<group_key>", "failed_before": "<ISO time>"}          # a group / all: only older failures
    "all"                                     # every unresolved one

:func:`by_ids`, :func:`by_group` and :func:`all_unresolved` build them.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Mapping

from django.db.models import QuerySet

from core.failures.records import MAX_IN, base, chunks
from core.models import FailureStatus


def by_ids(ids: Iterable[str]) -> dict[str, Any]:
    return {"ids": [str(i) for i in ids]}


def by_group(group_key: str) -> dict[str, Any]:
    return {"group": group_key}


def all_unresolved(queue: str | None = None, message_type: str | None = None) -> dict[str, Any]:
    sel: dict[str, Any] = {"all": True}
    if queue:
        sel["queue"] = queue
    if message_type:
        sel["message_type"] = message_type
    return sel


def normalise(selection: Any) -> dict[str, Any]:
    """A selection in its one dict form; ValueError for anything else."""
    if selection == "all":
        return {"all": True}
    if isinstance(selection, str):
        raise ValueError("a selection is a list of message ids, {'ids': [...]}, {'group': key} or "
                         "{'all': True, 'queue': ..., 'message_type': ...}; a single id goes in a list")
    if isinstance(selection, (list, tuple, set, frozenset)):
        return by_ids(selection)
    if isinstance(selection, Mapping):
        if "ids" in selection:
            return by_ids(selection["ids"])
        if selection.get("group"):
            sel = {"group": str(selection["group"])}
        elif selection.get("all"):
            sel = all_unresolved(selection.get("queue"), selection.get("message_type"))
        else:
            raise ValueError(f"not a selection of failed messages: {selection!r}")
        if selection.get("failed_before"):  # ISO time: only records whose latest failure is older
            sel["failed_before"] = str(selection["failed_before"])
        return sel
    raise ValueError(f"not a selection of failed messages: {selection!r}")


#: Which statuses an operation acts on: an explicit list of ids may include archived
#: records (retry); groups and "all" take unresolved ones only.
ELIGIBLE = {
    ("retry", "ids"): (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED),
    ("retry", "bulk"): (FailureStatus.UNRESOLVED,),
    ("archive", "ids"): (FailureStatus.UNRESOLVED,),
    ("archive", "bulk"): (FailureStatus.UNRESOLVED,),
    ("restore", "ids"): (FailureStatus.ARCHIVED,),
    ("restore", "bulk"): (FailureStatus.ARCHIVED,),
}


def eligible(kind: str, sel: Mapping[str, Any]) -> tuple[str, ...]:
    """The statuses operation ``kind`` acts on for a (normalised) selection."""
    return ELIGIBLE[(kind, "ids" if "ids" in sel else "bulk")]


def with_ids(ids: list[str], statuses: tuple[str, ...], using: str) -> QuerySet:
    return base(using).filter(message_id__in=ids, status__in=statuses)


def matching(sel: Mapping[str, Any], statuses: tuple[str, ...], using: str) -> QuerySet:
    """The records of a group / "all" selection (its filters) in ``statuses``."""
    qs = base(using).filter(status__in=statuses)
    if "group" in sel:
        qs = qs.filter(group_key=sel["group"])
    if sel.get("queue"):
        qs = qs.filter(original_queue=sel["queue"])
    if sel.get("message_type"):
        qs = qs.filter(message_type=sel["message_type"])
    if sel.get("failed_before"):
        qs = qs.filter(time_of_failure__lt=dt.datetime.fromisoformat(sel["failed_before"]))
    if "upto" in sel:  # a snapshot taken when the operation started
        qs = qs.filter(pk__lte=sel["upto"])
    return qs


def querysets(sel: Mapping[str, Any], statuses: tuple[str, ...], using: str) -> list[QuerySet]:
    """The records of a normalised selection in ``statuses``: one queryset per ≤ MAX_IN ids, or one."""
    if "ids" in sel:
        return [with_ids(chunk, statuses, using) for chunk in chunks(sel["ids"], MAX_IN)]
    return [matching(sel, statuses, using)]


def describe(sel: Mapping[str, Any], using: str) -> str:
    if "ids" in sel:
        ids = sel["ids"]
        return f"message {ids[0]}" if len(ids) == 1 else f"{len(ids)} selected messages"
    if "group" in sel:
        record = base(using).filter(group_key=sel["group"]).only("group_title").first()
        return f"group {record.group_title if record else sel['group']}"
    text = "all unresolved"
    if sel.get("queue"):
        text += f" of queue {sel['queue']}"
    if sel.get("message_type"):
        text += f" of type {sel['message_type']}"
    return text
