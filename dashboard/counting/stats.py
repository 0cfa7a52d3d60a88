"""What the overview, ``GET /api/queues/`` and ``/metrics`` show, computed at most once per
few seconds for everyone.

:func:`snapshot` returns a :class:`Snapshot` from a shared cache (Django cache alias
``sluice``, Redis; a per-process cache when Redis is down) or computes it with a bounded
number of cheap statements however many queues and tabs there are:

- all queues in one or two ``UNION ALL`` statements (dialect ``queue_stats``): min / max
  RowVersion, rows and expired rows counted up to ``SLUICE_DASHBOARD_EXACT_COUNT_LIMIT``
  (an exact count below it; above it ``max − min + 1``, marked ``estimated``), the oldest
  row's headers (its age);
- the delayed store: due / scheduled per destination among its earliest rows (capped);
- failed messages: by status, and unresolved by queue, exact, from the counts the database
  keeps per status and queue (one statement; dashboard/counting/failed_counts.py);
- worker and breaker health from Redis heartbeats ("unknown" when Redis is down).

A queue whose table cannot be read gets ``error`` set instead of numbers; nothing here
raises for a database or Redis problem.  Throughput is the growth of each queue's
newest RowVersion between snapshots (sent per minute) and the workers' processed
counters (processed per minute).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections, transaction

from core.conf import get_settings
from core.delayed import SqlDelayedStore, delayed_store
from core.dialects import dialect_for
from core.runtime.health import read_health
from core.monitoring.measurements import age_from_headers
from core.models import FailureStatus, QueueRecord
from dashboard.counting.failed_counts import FailedCounts, count_failed
# The cache layer, under the names the dashboard's modules and tests have used from here.
from dashboard.counting.shared_cache import (  # noqa: F401 — re-exported
    CACHE_ALIAS, GENERATION_KEY, STALE_LIMIT, _cache, _cache_get, _cache_set, _local, _local_lock,
    _refresh_in_background, cache_get, cache_set, reset_local, shared,
)

log = logging.getLogger("sluice.dashboard")

SNAPSHOT_KEY = "sluice:dashboard:snapshot"
SAMPLES_KEY = "sluice:dashboard:samples"
#: Queues per UNION ALL statement.
QUEUES_PER_STATEMENT = 50
#: Delayed messages looked at per snapshot (counts above this are "at least").
DELAYED_SCAN_LIMIT = 10_000
#: Throughput is measured over about this many seconds (samples kept that long).
THROUGHPUT_WINDOW = 300.0
REFRESH_KEY = SNAPSHOT_KEY + ":refreshing"


@dataclass
class QueueStats:
    name: str
    kind: str
    #: Messages waiting (not expired); None when the table could not be read.
    pending: int | None = None
    #: Expired, not yet purged (at least this many when ``expired_capped``).
    expired: int | None = None
    #: All rows (pending + expired).
    total: int | None = None
    #: ``total``/``pending`` come from max − min RowVersion, not a count (big queue).
    estimated: bool = False
    expired_capped: bool = False
    #: Delayed messages for this queue that are due / not yet due.
    delayed_due: int = 0
    scheduled: int = 0
    #: Unresolved failed messages that failed in this queue (exactly this name).
    errors: int = 0
    #: Always False: ``errors`` is exact (the database keeps it).  Kept for the API's
    #: ``errors_estimated`` / ``errors_capped``, which were true above a cap before.
    errors_estimated: bool = False
    errors_capped: bool = False
    #: Age in seconds of the oldest message (from its TimeSent header).
    oldest_age_seconds: float | None = None
    #: Messages sent to it per minute over the last few minutes (None until two snapshots).
    sent_per_minute: float | None = None
    ttl_seconds: float | None = None
    #: Why the numbers are missing ("table unreadable: …"), else "".
    error: str = ""


@dataclass
class Health:
    #: "up", "down" (Redis unreachable) — workers and breakers are then unknown.
    redis: str = "unknown"
    workers: list[dict[str, Any]] = field(default_factory=list)
    #: [{"worker", "breaker"}] of every triggered circuit breaker.
    triggered: list[dict[str, str]] = field(default_factory=list)
    #: Sum of the live workers' processed counters (None when Redis is down).
    processed_total: int | None = None
    processed_per_minute: float | None = None
    error: str = ""


@dataclass
class Snapshot:
    at: dt.datetime
    queues: list[QueueStats]
    #: Failed-message records by status (every status present, 0 when none).
    failed: dict[str, int]
    health: Health
    #: Always empty: the ``failed`` counts are exact (see QueueStats.errors_estimated).
    failed_estimated: list[str] = field(default_factory=list)
    failed_capped: list[str] = field(default_factory=list)
    #: The delayed store had more rows than were looked at: delayed counts are lower bounds.
    delayed_capped: bool = False
    delayed_error: str = ""
    #: Trouble reading the registry or failed messages ("" when none).
    problem: str = ""
    #: How long computing it took (milliseconds).
    compute_ms: float = 0.0

    def queue(self, name: str) -> QueueStats | None:
        return next((q for q in self.queues if q.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["at"] = self.at.isoformat()
        return data


def clear_cache() -> None:
    """Forget the cached snapshot (after an action, in tests)."""
    reset_local()
    try:
        _cache().delete_many([SNAPSHOT_KEY, SAMPLES_KEY, REFRESH_KEY])
        _cache().set(GENERATION_KEY, time.time_ns(), 24 * 3600)  # cache_set's values too
    except Exception:  # noqa: BLE001
        pass


def forget_snapshot() -> None:
    """Forget the cached snapshot after an action, so the next page shows its effect; the
    throughput samples stay (clearing them would blank every rate for minutes)."""
    with _local_lock:
        _local.pop(SNAPSHOT_KEY, None)
        _local.pop(REFRESH_KEY, None)
    _cache_set(GENERATION_KEY, time.time_ns(), 24 * 3600)  # what cache_set stored is out of date
    try:
        _cache().delete_many([SNAPSHOT_KEY, REFRESH_KEY])
    except Exception:  # noqa: BLE001 — Redis down: the snapshot expires on its own
        pass


# -- public -------------------------------------------------------------------------------------

def snapshot(max_age: float | None = None) -> Snapshot:
    """The current snapshot: cached for ``SLUICE_DASHBOARD_CACHE_SECONDS`` (or ``max_age``;
    0 computes a fresh one).  A snapshot up to :data:`STALE_LIMIT` old is returned at once
    while one thread refreshes it in the background, so no page waits for a refresh once
    one snapshot exists.  Never raises for database or Redis trouble."""
    seconds = get_settings().DASHBOARD_CACHE_SECONDS if max_age is None else max_age
    if seconds <= 0:
        return compute_snapshot()
    cached = _cache_get(SNAPSHOT_KEY)
    if isinstance(cached, Snapshot):
        age = (dt.datetime.now(dt.timezone.utc) - cached.at).total_seconds()
        if age <= seconds:
            return cached
        if age <= max(STALE_LIMIT, seconds) and get_settings().DASHBOARD_REFRESH_IN_BACKGROUND:
            _refresh_in_background(SNAPSHOT_KEY, compute_snapshot, seconds)
            return cached
    snap = compute_snapshot()
    _cache_set(SNAPSHOT_KEY, snap, max(STALE_LIMIT, seconds))
    return snap


def queue_stats(name: str) -> QueueStats | None:
    """One queue's numbers from the (cached) snapshot; None for a queue it does not know."""
    return snapshot().queue(name)


def health() -> Health:
    """Workers and breakers (from the cached snapshot)."""
    return snapshot().health


def compute_snapshot() -> Snapshot:
    """A fresh snapshot (bypasses the cache; :func:`snapshot` is what pages call)."""
    started = time.perf_counter()
    now = dt.datetime.now(dt.timezone.utc)
    problem = ""
    try:
        records = list(QueueRecord.objects.all())
    except DatabaseError as exc:
        log.warning("cannot read the queue registry: %s", exc)
        records = []
        problem = "The queue registry cannot be read. Has `python manage.py sluice setup` run?"
    queues = [QueueStats(name=r.name, kind=r.kind, ttl_seconds=r.default_ttl_seconds) for r in records]
    highs = _fill_queue_counts(queues)
    delayed_capped, delayed_error = _fill_delayed(queues)
    failed, failed_problem = _fill_failed(queues)
    snap = Snapshot(at=now, queues=queues, failed=failed.by_status if failed else
                    {status: 0 for status in FailureStatus.values}, health=_health(),
                    delayed_capped=delayed_capped, delayed_error=delayed_error, problem=problem or failed_problem)
    _fill_throughput(snap, highs)
    snap.compute_ms = (time.perf_counter() - started) * 1000
    return snap


# -- queues -------------------------------------------------------------------------------------

def _fill_queue_counts(queues: list[QueueStats]) -> dict[str, int | None]:
    """Fill in the counts; returns each readable queue's newest RowVersion (for throughput)."""
    cap = get_settings().DASHBOARD_EXACT_COUNT_LIMIT
    highs: dict[str, int | None] = {}
    for start in range(0, len(queues), QUEUES_PER_STATEMENT):
        chunk = queues[start:start + QUEUES_PER_STATEMENT]
        try:
            rows = _queue_rows([q.name for q in chunk], cap)
        except DatabaseError:
            # One unreadable table fails the whole statement: ask queue by queue to find it.
            rows = []
            for i, q in enumerate(chunk):
                try:
                    rows.extend((i, *row[1:]) for row in _queue_rows([q.name], cap))
                except DatabaseError as exc:
                    log.warning("cannot read queue table %s: %s", q.name, exc)
                    q.error = f"table unreadable: {str(exc).splitlines()[0][:200]}"
        for row in rows:
            q = chunk[int(row[0])]
            _apply_queue_row(q, row, cap)
            highs[q.name] = None if row[2] is None else int(row[2])
    return highs


def _guarded(alias: str):
    """A savepoint inside a transaction (a failed statement must not poison it on PostgreSQL);
    nothing in autocommit, where SQLite would otherwise take its write lock for a read."""
    return transaction.atomic(using=alias) if connections[alias].in_atomic_block else contextlib.nullcontext()


def _queue_rows(names: list[str], cap: int) -> list[tuple]:
    alias = get_settings().DATABASE
    d = dialect_for(connections[alias], get_settings().SCHEMA)
    with _guarded(alias), connections[alias].cursor() as cursor:
        cursor.execute(d.queue_stats(names), d.queue_stats_params(len(names), cap + 1))
        return cursor.fetchall()


def _apply_queue_row(q: QueueStats, row: tuple, cap: int) -> None:
    alias = get_settings().DATABASE
    d = dialect_for(connections[alias], get_settings().SCHEMA)
    _, low, high, counted, expired, headers, db_now = row
    counted, expired = int(counted or 0), int(expired or 0)
    if counted > cap and low is not None and high is not None:
        q.total, q.estimated = int(high) - int(low) + 1, True
    else:
        q.total = counted
    q.expired_capped = expired > cap
    q.expired = min(expired, q.total) if not q.expired_capped else expired
    q.pending = max(q.total - q.expired, 0)
    q.oldest_age_seconds = age_from_headers(headers, d.to_datetime(db_now))


# -- delayed, failed, health -----------------------------------------------------------------------

def _fill_delayed(queues: list[QueueStats]) -> tuple[bool, str]:
    store = delayed_store()
    if not isinstance(store, SqlDelayedStore):
        return False, f"the delayed store {type(store).__name__} has no counts"
    by_name = {q.name: q for q in queues}
    try:
        with _guarded(store.using), connections[store.using].cursor() as cursor:
            cursor.execute(store.dialect.delayed_stats(store.table), [DELAYED_SCAN_LIMIT])
            rows = cursor.fetchall()
    except DatabaseError as exc:
        log.warning("cannot read the delayed store %s: %s", store.table, exc)
        return False, f"delayed store unreadable: {str(exc).splitlines()[0][:200]}"
    seen = 0
    for destination, due, total in rows:
        seen += int(total)
        q = by_name.get(str(destination).split("@")[0])
        if q is not None:
            q.delayed_due += int(due or 0)
            q.scheduled += int(total) - int(due or 0)
    return seen >= DELAYED_SCAN_LIMIT, ""


def _fill_failed(queues: list[QueueStats]) -> tuple[FailedCounts | None, str]:
    alias = get_settings().DATABASE
    try:
        with _guarded(alias):
            counts = count_failed(alias, [q.name for q in queues])
    except DatabaseError as exc:
        log.warning("cannot count failed messages: %s", exc)
        return None, "Failed messages cannot be read. Have the migrations run?"
    for q in queues:
        q.errors = counts.by_queue[q.name]
    return counts, ""


def _health() -> Health:
    try:
        raw = read_health(get_settings().REDIS_URL)
    except Exception as exc:  # noqa: BLE001 — read_health should not raise; never let it break a page
        return Health(redis="unknown", error=str(exc))
    if raw.get("redis") != "up":
        return Health(redis="down", error=str(raw.get("error", "")))
    workers = raw.get("workers", [])
    triggered = [{"worker": str(w.get("name", "?")), "breaker": str(b.get("name", "?"))}
                 for w in workers for b in w.get("breakers", []) if b.get("state") == "triggered"]
    processed = sum(int(w.get("processed") or 0) for w in workers)
    return Health(redis="up", workers=workers, triggered=triggered, processed_total=processed)


# -- throughput -------------------------------------------------------------------------------------

def _fill_throughput(snap: Snapshot, highs: dict[str, int | None]) -> None:
    """Compare with the oldest kept sample of newest RowVersions / processed counters."""
    now = time.time()
    sample = {"t": now, "high": highs, "processed": snap.health.processed_total}
    samples = [s for s in (_cache_get(SAMPLES_KEY) or []) if now - s["t"] <= THROUGHPUT_WINDOW]
    base = next((s for s in samples if now - s["t"] >= 5.0), None)
    if base is not None:
        minutes = (now - base["t"]) / 60.0
        for q in snap.queues:
            then, current = base["high"].get(q.name), sample["high"].get(q.name)
            if then is not None and current is not None and current >= then:
                q.sent_per_minute = round((current - then) / minutes, 1)
            elif q.name in base["high"] and then is None and current is not None:
                q.sent_per_minute = round((q.total or 0) / minutes, 1)  # empty then: what is there now came since
            elif q.name in highs and q.name in base["high"] and current is None:
                q.sent_per_minute = 0.0  # empty then and now
        if base["processed"] is not None and snap.health.processed_total is not None \
                and snap.health.processed_total >= base["processed"]:
            snap.health.processed_per_minute = round((snap.health.processed_total - base["processed"]) / minutes, 1)
    samples.append(sample)
    _cache_set(SAMPLES_KEY, samples[-60:], THROUGHPUT_WINDOW)
