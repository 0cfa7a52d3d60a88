"""What alert rules evaluate (and the live monitoring tab shows): Sluice's health in numbers,
each read with a bounded query, never a full count of a big table.

- :func:`queue_levels`: every queue's pending messages (an exact count up to a cap, above it
  max − min RowVersion) and the age of its oldest message, 200 queues per ``UNION ALL``
  statement (the dialect's ``queue_levels``: index lookups and a capped count per queue);
- :func:`queues_with_completions`: which of some queues finished a message in a window
  (processing records, an index range on ``ended_us``, one ``EXISTS`` per queue asked);
- :func:`critical_times`: per queue, sent-to-handled seconds of the newest records in a window;
- :func:`failure_slices` / :func:`failed_groups`: unresolved failed messages of a window per
  group, with content filters (queue, message type, exception type, a header value);
- :func:`worker_health`: live workers and their circuit breakers (Redis heartbeats);
- :func:`outbox_backlog`: undispatched outbox records (counted up to a cap) and the oldest's age;
- :func:`delayed_overdue`: delayed messages due but not yet moved, and how overdue the oldest is;
- :func:`records_export_lag`: how long the oldest not-yet-exported processing record has waited.

Each raises :class:`django.db.DatabaseError` when the database fails; the caller decides
what a missing measurement means.
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import json
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Count, Exists, Max, Min, OuterRef
from django.utils import timezone

from core.conf import get_settings
from core.db import StatementCursor
from core.dialects import Dialect, dialect_for
from core.runtime.health import read_health
from core.messages import Headers, parse_wire_time
from core.models import DelayedMessageRow, FailedMessage, FailureStatus, OutboxRecord, QueueRecord
from core.records.export import watermark
from core.models.records import ProcessingRecord

#: Queues per UNION ALL statement (two parameters each: far below SQL Server's 2,100).
QUEUES_PER_STATEMENT = 200
#: Queue lengths are counted exactly up to here; above it they are max − min RowVersion + 1
#: (``estimated``): 100 queues cost 10,000 index entries, not a count of every row.
LEVEL_EXACT_LIMIT = 100
#: Processing records a critical-time reading looks at (the newest in its window).
CRITICAL_TIME_SAMPLE = 5000
#: Counts stop here (a bigger backlog is "at least").
COUNT_CAP = 10_000
#: Failure slices (group × queue × type × exception) read at most per window.
GROUP_LIMIT = 2000


def matches(pattern: Any, value: str | None) -> bool:
    """A rule filter: ``None``/"" matches everything, ``*`` any text (case-sensitive)."""
    if pattern in (None, "", "*"):
        return True
    return fnmatch.fnmatchcase(value or "", str(pattern))


@dataclass(frozen=True)
class QueueLevel:
    name: str
    kind: str
    #: Messages in the table (an estimate above the cap); None when the table is unreadable.
    pending: int | None
    oldest_age_seconds: float | None
    estimated: bool = False
    error: str = ""


def queue_levels(names: list[str] | None = None, cap: int = LEVEL_EXACT_LIMIT) -> list[QueueLevel]:
    """Every registered queue (or those named): pending messages and the oldest message's age."""
    records = QueueRecord.objects.order_by("name")
    if names is not None:
        records = records.filter(name__in=names)
    kinds = dict(records.values_list("name", "kind"))
    queues = list(kinds)
    d = dialect_for(connections[get_settings().DATABASE], get_settings().SCHEMA)
    levels: list[QueueLevel] = []
    for start in range(0, len(queues), QUEUES_PER_STATEMENT):
        chunk = queues[start:start + QUEUES_PER_STATEMENT]
        try:
            rows = _queue_rows(chunk, cap)
        except DatabaseError:
            rows = []  # one unreadable table fails the statement: ask queue by queue
            for i, name in enumerate(chunk):
                try:
                    rows.extend((i, *row[1:]) for row in _queue_rows([name], cap))
                except DatabaseError as exc:
                    levels.append(QueueLevel(name, kinds[name], None, None, error=str(exc).splitlines()[0][:200]))
        levels.extend(_level(chunk[int(row[0])], kinds[chunk[int(row[0])]], row, cap, d) for row in rows)
    return levels


def _queue_rows(names: list[str], cap: int) -> list[tuple]:
    alias = get_settings().DATABASE
    d = dialect_for(connections[alias], get_settings().SCHEMA)
    # Prepared where the database can, and without parameters (the dialect's queue_levels):
    # the same statement every evaluation, planned once per connection, where planning a
    # UNION ALL of 100 queues cost four times running it.
    with StatementCursor(alias) as cursor:
        cursor.execute(d.queue_levels(names, cap + 1), [], prepare=True)
        return cursor.fetchall()


def _level(name: str, kind: str, row: tuple, cap: int, d: Dialect) -> QueueLevel:
    _, low, high, counted, headers, db_now = row
    counted = int(counted or 0)
    estimated = counted > cap and low is not None and high is not None
    pending = int(high) - int(low) + 1 if estimated else counted
    return QueueLevel(name, kind, pending, age_from_headers(headers, d.to_datetime(db_now)), estimated)


def age_from_headers(headers: Any, now: dt.datetime | None) -> float | None:
    """Seconds since a row's ``TimeSent`` header (its Headers column as text or bytes); None
    when it has none or it cannot be read."""
    if headers is None or now is None:
        return None
    try:
        text = headers if isinstance(headers, str) else bytes(headers).decode("utf-8", "replace")
        sent = json.loads(text).get(Headers.TIME_SENT)
        return max((now - parse_wire_time(sent)).total_seconds(), 0.0) if sent else None
    except (ValueError, TypeError, AttributeError):
        return None


def queues_with_completions(queues: list[str], window_seconds: float) -> set[str]:
    """Which of ``queues`` have a processing record that ended in the last ``window_seconds``
    (any outcome: the pump took the message): one statement, an ``EXISTS`` per queue that
    stops at the first record it finds.  Needs SLUICE_PROCESSING_RECORDS."""
    using = get_settings().DATABASE
    cutoff = int((time.time() - window_seconds) * 1_000_000)
    recent = ProcessingRecord.objects.using(using).filter(queue=OuterRef("name"), ended_us__gte=cutoff)
    return set(QueueRecord.objects.using(using).filter(name__in=queues).annotate(done=Exists(recent))
               .filter(done=True).values_list("name", flat=True))


def critical_times(window_seconds: float, limit: int = CRITICAL_TIME_SAMPLE) -> dict[str, list[float]]:
    """Per queue, the critical times (seconds from ``TimeSent`` to the end of handling) of
    the newest ``limit`` processing records that ended in the window: one statement on the
    ``ended_us`` index, however busy the queues."""
    cutoff = int((time.time() - window_seconds) * 1_000_000)
    rows = (ProcessingRecord.objects.using(get_settings().DATABASE)
            .filter(ended_us__gte=cutoff, time_sent_us__isnull=False).order_by("-ended_us")
            .values_list("queue", "ended_us", "time_sent_us")[:limit])
    found: dict[str, list[float]] = {}
    for queue, ended, sent in rows:
        found.setdefault(queue, []).append(max(ended - sent, 0) / 1_000_000)
    return found


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]


@dataclass(frozen=True)
class FailedGroup:
    group_key: str
    title: str
    #: Unresolved messages of the group that failed within the window.
    count: int
    first_failed_at: dt.datetime | None
    #: The group's queue / message type / exception type, when every message counted shares it.
    queue: str = ""
    message_type: str = ""
    exception_type: str = ""


@dataclass(frozen=True)
class FailureSlice:
    """Unresolved failures of one group, queue, message type and exception type in a window."""

    group_key: str
    title: str
    queue: str
    message_type: str
    exception_type: str
    count: int
    first_failed_at: dt.datetime | None


def failure_slices(window_seconds: float, header: dict[str, str] | None = None) -> list[FailureSlice]:
    """Unresolved failed messages whose latest failure is in the window, counted per group,
    queue, message type and exception type (at most :data:`GROUP_LIMIT` slices, the biggest
    first), optionally only those carrying ``header`` values: one grouped statement on the
    (status, time_of_failure) index, which :func:`failed_groups` filters and sums per rule."""
    rows = FailedMessage.objects.using(get_settings().DATABASE).filter(
        status=FailureStatus.UNRESOLVED, time_of_failure__gte=timezone.now() - dt.timedelta(seconds=window_seconds))
    for name, value in (header or {}).items():
        # Headers are stored as compact JSON text (core.messages.encode_headers): match the pair's own text.
        pair = json.dumps({str(name): str(value)}, ensure_ascii=False, separators=(",", ":"))[1:-1]
        rows = rows.filter(headers__contains=pair)
    grouped = (rows.order_by().values("group_key", "original_queue", "message_type", "exception_type")
               .annotate(n=Count("pk"), title=Max("group_title"), first=Min("first_failed_at")).order_by("-n"))
    return [FailureSlice(g["group_key"], g["title"] or g["group_key"], g["original_queue"] or "", g["message_type"] or "",
                         g["exception_type"] or "", int(g["n"]), g["first"]) for g in grouped[:GROUP_LIMIT]]


def failed_groups(slices: list[FailureSlice], filters: dict[str, Any] | None = None) -> list[FailedGroup]:
    """The groups among ``slices`` (:func:`failure_slices`) that match ``filters`` (queue,
    message_type, exception_type, ``*`` wildcards), biggest first."""
    filters = filters or {}
    sums: dict[str, list[FailureSlice]] = {}
    for piece in slices:
        if matches(filters.get("queue"), piece.queue) and matches(filters.get("message_type"), piece.message_type) \
                and matches(filters.get("exception_type"), piece.exception_type):
            sums.setdefault(piece.group_key, []).append(piece)
    groups = []
    for key, pieces in sums.items():
        firsts = [p.first_failed_at for p in pieces if p.first_failed_at is not None]
        common = [{getattr(p, f) for p in pieces} for f in ("queue", "message_type", "exception_type")]
        queue, message_type, exception_type = (next(iter(c)) if len(c) == 1 else "" for c in common)
        groups.append(FailedGroup(key, pieces[0].title, sum(p.count for p in pieces), min(firsts, default=None),
                                  queue, message_type, exception_type))
    return sorted(groups, key=lambda g: -g.count)


@dataclass(frozen=True)
class BreakerReading:
    worker: str
    breaker: str
    state: str
    last_error: str = ""


@dataclass(frozen=True)
class WorkerHealth:
    #: "up" or "down": whether Redis (where heartbeats live) answered.
    redis: str
    workers: list[str] = field(default_factory=list)
    breakers: list[BreakerReading] = field(default_factory=list)
    error: str = ""


def worker_health(redis_url: str) -> WorkerHealth:
    raw = read_health(redis_url)
    if raw.get("redis") != "up":
        return WorkerHealth("down", error=str(raw.get("error", "")))
    workers = raw.get("workers", [])
    return WorkerHealth("up", [str(w.get("name", "?")) for w in workers], [
        BreakerReading(str(w.get("name", "?")), str(b.get("name", "?")), str(b.get("state", "")),
                       str(b.get("last_error", ""))[:300])
        for w in workers for b in w.get("breakers", [])])


@dataclass(frozen=True)
class Backlog:
    #: Items waiting (at most :data:`COUNT_CAP`: "at least" when ``capped``).
    count: int
    oldest_age_seconds: float | None
    capped: bool = False


def outbox_backlog() -> Backlog | None:
    """Undispatched outbox records; None when the endpoint has no outbox table."""
    records = OutboxRecord.objects.using(get_settings().DATABASE).filter(dispatched=False)
    try:
        count = records[:COUNT_CAP + 1].count()
        oldest = records.order_by("created_at").values_list("created_at", flat=True).first()
    except DatabaseError as exc:
        if dialect_for(connections[get_settings().DATABASE]).is_missing_table(exc):
            return None
        raise
    return Backlog(min(count, COUNT_CAP), _since(oldest), count > COUNT_CAP)


def delayed_overdue(grace_seconds: float = 0.0) -> Backlog:
    """Delayed messages due more than ``grace_seconds`` ago (the mover should have moved them)."""
    due = DelayedMessageRow.objects.using(get_settings().DATABASE).filter(
        time__lte=timezone.now() - dt.timedelta(seconds=grace_seconds))
    count = due[:COUNT_CAP + 1].count()
    oldest = due.order_by("time").values_list("time", flat=True).first()
    return Backlog(min(count, COUNT_CAP), _since(oldest), count > COUNT_CAP)


def records_export_lag() -> float | None:
    """Seconds since the oldest processing record not yet exported ended (None: all exported)."""
    using = get_settings().DATABASE
    ended = (ProcessingRecord.objects.using(using).filter(id__gt=watermark(using)).order_by("id")
             .values_list("ended_us", flat=True).first())
    return None if ended is None else max(time.time() - ended / 1_000_000, 0.0)


def _since(when: dt.datetime | None) -> float | None:
    if when is None:
        return None
    if timezone.is_naive(when):
        when = timezone.make_aware(when, dt.timezone.utc)
    return max((timezone.now() - when).total_seconds(), 0.0)
