"""What each kind of rule checks: a rule and the current readings → the scopes that breach it.

Readings are taken once per evaluation (:class:`Readings`, lazily: a measurement no rule
needs is never read), so 50 rules over 100 queues cost the same few statements as one.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from django.utils import timezone

from core.runtime import pauses
from core.db import database_now_us
from core.monitoring import measurements as m
from core.models.alerts import AlertDelivery, AlertRule, DeliveryStatus, RuleKind, WorkerSighting
from core.conf import get_settings

#: A worker gone longer than this is forgotten (no more heartbeat alerts for it).
FORGET_WORKER_AFTER = 24 * 3600.0
#: Breakers (the part of their name before ":") that trip when a worker's database fails:
#: a pump's receive and processing (a handler's own errors never count there) and the
#: delayed mover's.
DATABASE_BREAKERS = ("pump-receive", "pump-processing", "delayed-fetch", "delayed-dispatch", "delayed-store")


@dataclass(frozen=True)
class Breach:
    """One scope that breaches a rule: its labels (besides alertname and severity), the
    measured value and a sentence for people."""

    labels: dict[str, str]
    value: float
    summary: str


class Readings:
    """The measurements of one evaluation, each read at most once."""

    def __init__(self) -> None:
        self.now = timezone.now()
        self._slices: dict[tuple, list[m.FailureSlice]] = {}
        self._completed: dict[float, set[str]] = {}
        self._critical: dict[float, dict[str, list[float]]] = {}

    @cached_property
    def queues(self) -> list[m.QueueLevel]:
        return m.queue_levels()

    @cached_property
    def paused(self) -> dict[str, float]:
        """Paused queues and how long each has been, in seconds of the database's clock."""
        found = pauses.paused_queues()
        if not found:
            return {}
        now = database_now_us() / 1e6
        return {name: max(now - p.paused_at.timestamp(), 0.0) for name, p in found.items()}

    @cached_property
    def health(self) -> m.WorkerHealth:
        return m.worker_health(get_settings().REDIS_URL)

    @cached_property
    def outbox(self) -> m.Backlog | None:
        return m.outbox_backlog()

    @cached_property
    def delayed(self) -> m.Backlog:
        return m.delayed_overdue()

    @cached_property
    def export_lag(self) -> float | None:
        return m.records_export_lag()

    @cached_property
    def silent_workers(self) -> list[tuple[str, float]]:
        """(worker, seconds since its last heartbeat) for every worker seen before that has
        none now; records the live ones first (a few statements however many workers)."""
        health = self.health
        if health.redis != "up":
            return []  # unknown, not lost: the redis_down rule speaks for this
        live = set(health.workers)
        known = dict(WorkerSighting.objects.values_list("name", "last_seen"))
        forgotten = [name for name, seen in known.items()
                     if (self.now - seen).total_seconds() > FORGET_WORKER_AFTER and name not in live]
        if forgotten:  # only then a write: SQLite would otherwise lock the database each evaluation
            WorkerSighting.objects.filter(name__in=forgotten).delete()
            known = {name: seen for name, seen in known.items() if name not in forgotten}
        if live & set(known):
            WorkerSighting.objects.filter(name__in=live).update(last_seen=self.now)
        WorkerSighting.objects.bulk_create([WorkerSighting(name=name, last_seen=self.now) for name in live - set(known)],
                                           ignore_conflicts=True)
        return [(name, (self.now - seen).total_seconds()) for name, seen in known.items() if name not in live]

    def groups(self, window: float, filters: dict[str, Any]) -> list[m.FailedGroup]:
        """One grouped read per window (and header filter), shared by every failed-group rule."""
        header = filters.get("header") or {}
        key = (window, repr(sorted(header.items())))
        if key not in self._slices:
            self._slices[key] = m.failure_slices(window, header)
        return m.failed_groups(self._slices[key], filters)

    def critical(self, window: float) -> dict[str, list[float]]:
        if window not in self._critical:
            self._critical[window] = m.critical_times(window)
        return self._critical[window]

    def completed(self, window: float) -> set[str]:
        """Which waiting queues finished a message in the window: one statement per window for
        every stalled-queue rule (only a queue with messages can stall)."""
        if window not in self._completed:
            waiting = [q.name for q in self.queues if q.pending]
            self._completed[window] = m.queues_with_completions(waiting, window) if waiting else set()
        return self._completed[window]


def _queues(rule: AlertRule, readings: Readings) -> list[m.QueueLevel]:
    pattern = (rule.filters or {}).get("queue")
    error_queue = get_settings().ERROR_QUEUE
    return [q for q in readings.queues if q.pending is not None and m.matches(pattern, q.name)
            and (pattern or q.kind == "normal" or q.name == error_queue)]


def _queue_length(rule: AlertRule, readings: Readings) -> list[Breach]:
    return [Breach({"queue": q.name}, q.pending, f"queue {q.name} holds {q.pending} messages "
                   f"(above {rule.threshold:g})") for q in _queues(rule, readings) if q.pending > rule.threshold]


def _oldest_age(rule: AlertRule, readings: Readings) -> list[Breach]:
    return [Breach({"queue": q.name}, q.oldest_age_seconds,
                   f"the oldest message in {q.name} waited {q.oldest_age_seconds:.0f} s (above {rule.threshold:g} s)")
            for q in _queues(rule, readings)
            if q.pending and q.oldest_age_seconds is not None and q.oldest_age_seconds > rule.threshold]


def _critical_time(rule: AlertRule, readings: Readings) -> list[Breach]:
    pattern = (rule.filters or {}).get("queue")
    found = []
    for queue, times in readings.critical(rule.window_seconds).items():
        value = m.p95(times)
        if m.matches(pattern, queue) and value > rule.threshold:
            found.append(Breach({"queue": queue}, value, f"critical time p95 of {queue} is {value:.1f} s over the "
                                f"last {rule.window_seconds:g} s (above {rule.threshold:g} s)"))
    return found


def _stalled(rule: AlertRule, readings: Readings) -> list[Breach]:
    window = rule.window_seconds
    # Only a queue whose oldest message waited the whole window can have stalled for it.
    # A paused queue waits on purpose: the queue_paused rule speaks for it.
    paused = readings.paused
    waiting = [q for q in _queues(rule, readings) if q.pending and q.pending > rule.threshold
               and q.oldest_age_seconds is not None and q.oldest_age_seconds >= window and q.name not in paused]
    done = readings.completed(window) if waiting else set()
    return [Breach({"queue": q.name}, q.pending, f"queue {q.name} has {q.pending} messages waiting and "
                   f"finished none in {window:g} s") for q in waiting if q.name not in done]


def _queue_paused(rule: AlertRule, readings: Readings) -> list[Breach]:
    pattern = (rule.filters or {}).get("queue")
    return [Breach({"queue": name}, age, f"queue {name} has been paused for {age:.0f} s (above {rule.threshold:g} s); "
                   "its messages wait until it is resumed")
            for name, age in readings.paused.items() if age > rule.threshold and m.matches(pattern, name)]


def _failed_group(rule: AlertRule, readings: Readings) -> list[Breach]:
    need = max(rule.threshold, 1)
    return [Breach({"group": g.group_key, **({"queue": g.queue} if g.queue else {}),
                    **({"message_type": g.message_type} if g.message_type else {})}, g.count,
                   f"{g.count} failed message(s) in group {g.title} within {rule.window_seconds:g} s")
            for g in readings.groups(rule.window_seconds, rule.filters or {}) if g.count >= need]


def _breaker_open(rule: AlertRule, readings: Readings) -> list[Breach]:
    f = rule.filters or {}
    return [Breach({"worker": b.worker, "breaker": b.breaker}, 1,
                   f"circuit breaker {b.breaker} on {b.worker} is open: {b.last_error}")
            for b in readings.health.breakers
            if b.state == "triggered" and m.matches(f.get("breaker"), b.breaker) and m.matches(f.get("worker"), b.worker)]


def _database_down(rule: AlertRule, readings: Readings) -> list[Breach]:
    """Workers' pumps and loops trip their breakers when their database stops answering."""
    return [Breach({"worker": b.worker, "breaker": b.breaker}, 1,
                   f"worker {b.worker} cannot reach the database ({b.breaker}): {b.last_error}")
            for b in readings.health.breakers if b.state == "triggered" and m.matches(
                (rule.filters or {}).get("worker"), b.worker)
            and b.breaker.split(":", 1)[0] in DATABASE_BREAKERS]


def _heartbeat_lost(rule: AlertRule, readings: Readings) -> list[Breach]:
    pattern = (rule.filters or {}).get("worker")
    return [Breach({"worker": name}, age, f"worker {name} sent no heartbeat for {age:.0f} s")
            for name, age in readings.silent_workers if age > rule.threshold and m.matches(pattern, name)]


def _workers_below(rule: AlertRule, readings: Readings) -> list[Breach]:
    """Fewer live workers (those matching the ``worker`` filter) than the threshold, at least
    one: "no worker at all" needs no worker to have been seen before."""
    health = readings.health
    if health.redis != "up":
        return []  # unknown, not missing: the redis_down rule speaks for this
    need = max(int(rule.threshold), 1)
    pattern = (rule.filters or {}).get("worker")
    live = sum(1 for name in set(health.workers) if m.matches(pattern, name))
    if live >= need:
        return []
    scope = f" matching {pattern}" if pattern else ""
    said = "no worker" if not live else f"only {live} worker{'s' if live > 1 else ''}"
    return [Breach({"service": "workers"}, live, f"{said}{scope} sent a heartbeat (at least {need} expected)")]


def _outbox(rule: AlertRule, readings: Readings) -> list[Breach]:
    box = readings.outbox
    if box is None:
        return []
    if rule.kind == RuleKind.OUTBOX_BACKLOG:
        return [Breach({"outbox": get_settings().outbox_table}, box.count,
                       f"{box.count}{'+' if box.capped else ''} outbox records wait for dispatch "
                       f"(above {rule.threshold:g})")] if box.count > rule.threshold else []
    age = box.oldest_age_seconds
    return [Breach({"outbox": get_settings().outbox_table}, age,
                   f"the oldest undispatched outbox record waited {age:.0f} s")] \
        if age is not None and age > rule.threshold else []


def _delayed(rule: AlertRule, readings: Readings) -> list[Breach]:
    d = readings.delayed
    age = d.oldest_age_seconds
    return [Breach({"store": get_settings().delayed_table}, age,
                   f"{d.count}{'+' if d.capped else ''} delayed messages are due and not moved; the oldest "
                   f"for {age:.0f} s")] if age is not None and age > rule.threshold else []


def _redis_down(rule: AlertRule, readings: Readings) -> list[Breach]:
    h = readings.health
    return [Breach({"service": "redis"}, 1, f"Redis is unreachable: {h.error}"[:300])] if h.redis != "up" else []


def _records(rule: AlertRule, readings: Readings) -> list[Breach]:
    lag = readings.export_lag
    return [Breach({"service": "records-export"}, lag, f"processing records have waited {lag:.0f} s for export")] \
        if lag is not None and lag > rule.threshold else []


def _delivery_failed(rule: AlertRule, readings: Readings) -> list[Breach]:
    since = readings.now - dt.timedelta(seconds=rule.window_seconds)
    failed = (AlertDelivery.objects.filter(status=DeliveryStatus.FAILED, finished_at__gte=since)
              .values_list("target__name", flat=True)[:1000])
    counts: dict[str, int] = {}
    for name in failed:
        counts[name] = counts.get(name, 0) + 1
    return [Breach({"target": name}, n, f"{n} notification(s) to {name} finally failed") for name, n in counts.items()]


CHECKS: dict[str, Callable[[AlertRule, Readings], list[Breach]]] = {
    RuleKind.QUEUE_LENGTH: _queue_length,
    RuleKind.OLDEST_AGE: _oldest_age,
    RuleKind.CRITICAL_TIME: _critical_time,
    RuleKind.STALLED_QUEUE: _stalled,
    RuleKind.FAILED_GROUP: _failed_group,
    RuleKind.BREAKER_OPEN: _breaker_open,
    RuleKind.DATABASE_DOWN: _database_down,
    RuleKind.HEARTBEAT_LOST: _heartbeat_lost,
    RuleKind.WORKERS_BELOW: _workers_below,
    RuleKind.OUTBOX_BACKLOG: _outbox,
    RuleKind.OUTBOX_AGE: _outbox,
    RuleKind.DELAYED_NOT_MOVED: _delayed,
    RuleKind.REDIS_DOWN: _redis_down,
    RuleKind.RECORDS_NOT_EXPORTED: _records,
    RuleKind.DELIVERY_FAILED: _delivery_failed,
    RuleKind.QUEUE_PAUSED: _queue_paused,
}


def breaches(rule: AlertRule, readings: Readings) -> list[Breach]:
    return CHECKS[rule.kind](rule, readings)
