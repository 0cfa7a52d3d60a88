"""A conversation's messages: every message a first send caused, read from the processing
records and the failed-message records that carry its ``NServiceBus.ConversationId``.

What the dashboard's conversation view and ``/api/conversations/<id>/`` show.  A page holds
the newest ``limit`` entries (records and failures merged, newest first) and a cursor to
the older ones, so a conversation of 10,000 messages is read one index range at a time
(sluice_prec_conversation, sluice_fm_conversation) and never cut without saying so.

Records are per attempt: a message handled three times has three; a page groups them into
one :class:`Node` per message id.  Its parent is the node of its ``related_to`` when that
message is on the same page (else the node is a root that says its parent is elsewhere).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q

from core.conf import get_settings
from core.models import FailedMessage, FailureStatus
from core.models.records import ProcessingRecord
from pipeline import schema

#: Older entries are counted up to this many ("100000+"): a count is an index range too.
COUNT_CAP = 100_000
#: Outcomes that leave a message failed (until an operator's retry processes it).
FAILED_OUTCOMES = (schema.FAILED, schema.ERROR_QUEUE, schema.DEAD_LETTERED)
_RECORD_FIELDS = ("id", "message_id", "message_type", "queue", "endpoint", "time_sent_us", "deliver_at_us",
                  "started_us", "ended_us", "outcome", "attempt", "related_to", "correlation_id", "intent",
                  "originating_endpoint", "originating_host", "worker", "trace_id")
_FAILED_FIELDS = ("id", "message_id", "message_type", "original_queue", "time_of_failure", "status",
                  "related_to", "correlation_id", "exception_type")
#: Entry sources in a cursor: at the same microsecond a record sorts before a failure.
_RECORD, _FAILURE = 1, 0


#: The last microsecond a datetime holds (9999-12-31 23:59:59.999999 UTC), since the epoch.
MAX_CURSOR_US = 253_402_300_799_999_999


class BadCursor(ValueError):
    """A cursor this module did not give out."""


def us_of(when: dt.datetime) -> int:
    """An aware time as integer microseconds since the epoch (the records' unit), exactly."""
    return int(when.timestamp()) * 1_000_000 + when.microsecond


def time_of(us: int) -> dt.datetime:
    """Microseconds since the epoch as an aware UTC time, exactly (no float rounding)."""
    return dt.datetime.fromtimestamp(us // 1_000_000, dt.timezone.utc).replace(microsecond=us % 1_000_000)


@dataclass
class Node:
    """One message of the conversation, as the records and failures on this page tell it."""

    message_id: str
    message_type: str = ""
    queue: str = ""
    endpoint: str = ""
    intent: str = ""
    related_to: str = ""
    correlation_id: str = ""
    originating_endpoint: str = ""
    originating_host: str = ""
    worker: str = ""
    trace_id: str = ""
    time_sent_us: int | None = None
    deliver_at_us: int | None = None
    #: The latest attempt on this page.
    started_us: int | None = None
    ended_us: int | None = None
    outcome: str = ""
    #: Attempts recorded on this page (the latest attempt's own count is ``attempt``).
    records: int = 0
    attempt: int = 0
    #: The failed-message record (its id and status), when the message reached the error queue.
    failed_pk: int | None = None
    failed_status: str = ""
    exception_type: str = ""
    time_of_failure_us: int | None = None
    children: list[Node] = field(default_factory=list)
    #: ``related_to`` names a message that is not on this page (older, or never recorded).
    parent_elsewhere: bool = False

    # -- where the time went (µs; None when a timestamp is missing) ---------------------------
    @property
    def delayed_us(self) -> int | None:
        """Time sent → DeliverAt: the delay the sender asked for, kept apart from queue wait."""
        if self.deliver_at_us is None or self.time_sent_us is None:
            return None
        return self.deliver_at_us - self.time_sent_us

    @property
    def available_us(self) -> int | None:
        """When the message could be received: DeliverAt for a delayed send, else time sent."""
        return self.deliver_at_us if self.deliver_at_us is not None else self.time_sent_us

    @property
    def wait_us(self) -> int | None:
        """Queue wait: available → processing started."""
        if self.available_us is None or self.started_us is None:
            return None
        return self.started_us - self.available_us

    @property
    def processing_us(self) -> int | None:
        if self.started_us is None or self.ended_us is None:
            return None
        return self.ended_us - self.started_us

    @property
    def skewed(self) -> bool:
        """A negative duration: the sender's and the worker's clocks disagree (times are each
        machine's own), so the bars of this message are not to be trusted."""
        return any(d is not None and d < 0 for d in (self.delayed_us, self.wait_us, self.processing_us))

    @property
    def failed(self) -> bool:
        """Failed now: an unresolved (or archived) failure, or a last attempt that failed."""
        if self.failed_pk is not None:
            return self.failed_status in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED)
        return self.outcome in FAILED_OUTCOMES

    @property
    def retryable(self) -> bool:
        """An operator's retry applies (dashboard: the node's retry button)."""
        return self.failed_pk is not None and self.failed_status in (FailureStatus.UNRESOLVED,
                                                                      FailureStatus.ARCHIVED)

    @property
    def first_us(self) -> int | None:
        """Its earliest timestamp (the order of the timeline and the sequence)."""
        known = [t for t in (self.time_sent_us, self.started_us, self.ended_us, self.time_of_failure_us)
                 if t is not None]
        return min(known) if known else None

    @property
    def last_us(self) -> int | None:
        known = [t for t in (self.ended_us, self.time_of_failure_us, self.available_us) if t is not None]
        return max(known) if known else None


@dataclass
class ConversationPage:
    conversation_id: str
    #: Every message on this page, oldest first.
    nodes: list[Node]
    #: The flow: messages whose parent is not on this page, oldest first (children below).
    roots: list[Node]
    #: Entries (attempts and failures) on this page, and older ones beyond it (up to COUNT_CAP).
    entries: int
    older: int
    older_capped: bool
    #: Pass as ``cursor`` for the next (older) page; None on the last.
    next_cursor: str | None
    #: This page is not the newest one.
    paged: bool

    @property
    def skewed(self) -> list[Node]:
        return [n for n in self.nodes if n.skewed]

    @property
    def empty(self) -> bool:
        return not self.nodes


def parse_cursor(raw: str) -> tuple[int, int, int]:
    """``<µs>.<source>.<id>`` as given out in next_cursor (BadCursor otherwise)."""
    try:
        t, s, i = (int(part) for part in raw.split("."))
    except ValueError:
        raise BadCursor("cursor is not one this page gave out (pass next_cursor as it came)") from None
    # Past these a time makes no datetime (OverflowError) and an id no BIGINT: neither was given out.
    if s not in (_RECORD, _FAILURE) or not 0 <= t <= MAX_CURSOR_US or not 0 <= i < 2**63:
        raise BadCursor("cursor is not one this page gave out (pass next_cursor as it came)")
    return t, s, i


def _older_records(key: tuple[int, int, int]) -> Q:
    t, s, i = key
    return Q(ended_us__lt=t) | Q(ended_us=t, id__lt=i) if s == _RECORD else Q(ended_us__lt=t)


def _older_failures(key: tuple[int, int, int]) -> Q:
    t, s, i = key
    at = time_of(t)
    return Q(time_of_failure__lte=at) if s == _RECORD else Q(time_of_failure__lt=at) | Q(time_of_failure=at,
                                                                                          id__lt=i)


def _records(conversation_id: str, using: str):
    return ProcessingRecord.objects.using(using).filter(conversation_id=conversation_id)


def _failures(conversation_id: str, using: str):
    return FailedMessage.objects.using(using).filter(conversation_id=conversation_id)


def newest_records(conversation_id: str, limit: int, cursor: tuple[int, int, int] | None = None,
                   using: str | None = None):
    """The query of a page's records: newest first, one range of index sluice_prec_conversation."""
    qs = _records(conversation_id, using or get_settings().DATABASE)
    if cursor:
        qs = qs.filter(_older_records(cursor))
    return qs.order_by("-ended_us", "-id").values(*_RECORD_FIELDS)[:limit + 1]


def page(conversation_id: str, limit: int | None = None, cursor: str | None = None,
         using: str | None = None) -> ConversationPage:
    """The newest ``limit`` (SLUICE_CONVERSATION_PAGE) entries of a conversation older than
    ``cursor``, as messages and their flow.  BadCursor for a cursor not given out here."""
    using = using or get_settings().DATABASE
    limit = limit or get_settings().CONVERSATION_PAGE
    key = parse_cursor(cursor) if cursor else None
    records = list(newest_records(conversation_id, limit, key, using))
    failed_qs = _failures(conversation_id, using)
    if key:
        failed_qs = failed_qs.filter(_older_failures(key))
    failures = list(failed_qs.order_by("-time_of_failure", "-id").values(*_FAILED_FIELDS)[:limit + 1])
    entries: list[tuple[tuple[int, int, int], dict[str, Any]]] = (
        [((r["ended_us"], _RECORD, r["id"]), r) for r in records]
        + [((us_of(f["time_of_failure"]), _FAILURE, f["id"]), f) for f in failures])
    entries.sort(key=lambda e: e[0], reverse=True)
    more = len(entries) > limit
    entries = entries[:limit]
    older, capped, next_cursor = 0, False, None
    if more:
        last = entries[-1][0]
        next_cursor = ".".join(str(part) for part in last)
        older = (_records(conversation_id, using).filter(_older_records(last)).order_by()[:COUNT_CAP].count()
                 + _failures(conversation_id, using).filter(_older_failures(last)).order_by()[:COUNT_CAP].count())
        capped = older >= COUNT_CAP
        older = min(older, COUNT_CAP)
    nodes = _nodes(reversed(entries))
    return ConversationPage(conversation_id, nodes, _flow(nodes), len(entries), older, capped, next_cursor,
                            paged=key is not None)


def _nodes(oldest_first) -> list[Node]:
    """One node per message id; a later attempt's figures replace an earlier one's."""
    by_id: dict[str, Node] = {}
    for (_, source, _), row in oldest_first:
        node = by_id.get(row["message_id"])
        if node is None:
            node = by_id[row["message_id"]] = Node(row["message_id"])
        if source == _RECORD:
            node.records += 1
            for name in ("message_type", "queue", "endpoint", "intent", "related_to", "correlation_id",
                         "originating_endpoint", "originating_host", "worker", "trace_id"):
                if row[name]:
                    setattr(node, name, row[name])
            # An operator's retry keeps the message's id and times: the first send's intent stays.
            if node.records > 1 and row["intent"] == "retry":
                node.intent = "retry"
            node.time_sent_us, node.deliver_at_us = row["time_sent_us"], row["deliver_at_us"]
            node.started_us, node.ended_us = row["started_us"], row["ended_us"]
            node.outcome, node.attempt = row["outcome"], row["attempt"]
        else:
            node.failed_pk, node.failed_status = row["id"], row["status"]
            node.exception_type = row["exception_type"]
            node.time_of_failure_us = us_of(row["time_of_failure"])
            node.message_type = node.message_type or row["message_type"]
            node.queue = node.queue or row["original_queue"]
            node.related_to = node.related_to or row["related_to"]
            node.correlation_id = node.correlation_id or row["correlation_id"]
    return sorted(by_id.values(), key=lambda n: (n.first_us or 0, n.message_id))


def _flow(nodes: list[Node]) -> list[Node]:
    """Children under their parents (``related_to``); a message whose parent is elsewhere, or
    that names itself or a loop of messages, is a root: every node is drawn exactly once."""
    by_id = {n.message_id: n for n in nodes}
    roots: list[Node] = []
    for node in nodes:
        parent = by_id.get(node.related_to) if node.related_to and node.related_to != node.message_id else None
        if parent is None:
            node.parent_elsewhere = bool(node.related_to) and node.related_to != node.message_id
            roots.append(node)
        else:
            parent.children.append(node)
    reached: set[str] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        reached.add(node.message_id)
        stack.extend(node.children)
    for node in nodes:  # a loop of related_to (bad headers) is reached from nowhere: break it here
        if node.message_id not in reached:
            by_id[node.related_to].children.remove(node)
            roots.append(node)
            stack = [node]
            while stack:
                n = stack.pop()
                reached.add(n.message_id)
                stack.extend(n.children)
    return roots


def find(term: str, using: str | None = None) -> str | None:
    """The conversation a conversation id, message id or correlation id belongs to (each
    lookup one index probe), or None.

    A correlation id is found among the failed messages (indexed) and, through the records'
    message id index, wherever it is a message id: a send's correlation id is its own message
    id unless the sender chose one, and a reply's is its request's.  A chosen correlation id
    (``send(..., correlation_id="order-42")``) of a message that never failed is not indexed
    in the records: each index there costs every pump batch's insert."""
    using = using or get_settings().DATABASE
    term = term.strip()
    if not term:
        return None
    records = ProcessingRecord.objects.using(using).exclude(conversation_id=None).exclude(conversation_id="")
    failed = FailedMessage.objects.using(using).exclude(conversation_id="")
    if records.filter(conversation_id=term).exists() or failed.filter(conversation_id=term).exists():
        return term
    for qs in (records.filter(message_id=term), failed.filter(message_id=term), failed.filter(correlation_id=term)):
        # No ORDER BY: ordering by id would let the planner walk the primary key instead.
        found = list(qs.order_by().values_list("conversation_id", flat=True)[:1])
        if found:
            return found[0]
    return None
