"""Queue-length history: every registered queue's length, sampled every
``SLUICE_MONITORING_SAMPLE_INTERVAL`` seconds into ``sluice_queue_sample`` (the monitoring
tab's queue-length sparklines; one process's memory would forget it on restart and know
only what that process saw); and the processing records summed per queue and minute into
``sluice_queue_minute``, and those minutes per queue and hour into ``sluice_queue_hour``
(what an hour or a range of the tab reads instead of every record).

:class:`QueueSampler` is a loop (core.runtime.loops): every worker hosts one where the delayed mover
runs, and only the holder of the ``queue-sampler`` lease samples, so one row per queue and
interval is written however many workers run.  A step reads the queues' lengths with
:func:`core.monitoring.measurements.queue_levels` (capped counts, index lookups), writes them in one
INSERT, rolls up the minutes due (at most :data:`ROLLUP_MINUTES`) and the hours due (at
most :data:`ROLLUP_HOURS`) and deletes at most :data:`DELETE_BATCH` samples, minutes and
hours older than ``SLUICE_MONITORING_SAMPLE_RETENTION``:
bounded work, whatever the history holds.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from collections import defaultdict

from django.db import DatabaseError, transaction
from django.db.models import BigIntegerField, ExpressionWrapper, F, Sum, Value

from core.conf import get_settings
from core.db import database_now_us
from core.runtime.lease import Lease
from core.monitoring.measurements import queue_levels
from core.monitoring.live import US, Period, counts_query
from core.models.monitoring import SUMS, QueueHour, QueueMinute, QueueSample, RollupMark, grain_of
from pipeline import schema

log = logging.getLogger("sluice.monitoring")

LEASE_NAME = "queue-sampler"
#: Old samples one step deletes at most (the next steps delete the rest).
DELETE_BATCH = 5000
ROLLUP = "queue-minutes"
MINUTE = 60 * US
#: A minute is rolled up this long after it ended: the records of receive batches still
#: open then (their ended time is taken before the commit) have landed by now.
ROLLUP_LAG_SECONDS = 120
#: Minutes one step rolls up at most (a sampler that was away catches up step by step).
ROLLUP_MINUTES = 60
HOURS_ROLLUP = "queue-hours"
HOUR = 3600 * US
#: Hours one step rolls up at most.
ROLLUP_HOURS = 48


def sample_now(using: str | None = None, previous_us: int | None = None) -> tuple[int, int]:
    """Write one sample per registered queue now, ``previous_us`` the time of the previous
    sample (for its grain); returns (how many were written, their time)."""
    using = using or get_settings().DATABASE
    at = database_now_us(using)
    grain = grain_of(at, previous_us)
    rows = [QueueSample(queue=level.name, at_us=at, length=level.pending, estimated=level.estimated, grain=grain)
            for level in queue_levels() if level.pending is not None]
    QueueSample.objects.using(using).bulk_create(rows)
    return len(rows), at


def delete_old_samples(retention_seconds: float, using: str | None = None) -> int:
    """Delete at most :data:`DELETE_BATCH` samples older than the retention (the oldest first)."""
    using = using or get_settings().DATABASE
    cutoff = database_now_us(using) - int(retention_seconds * 1_000_000)
    old = list(QueueSample.objects.using(using).filter(at_us__lt=cutoff).order_by("at_us")
               .values_list("pk", flat=True)[:DELETE_BATCH])
    if not old:
        return 0
    return QueueSample.objects.using(using).filter(pk__in=old).delete()[0]


def roll_up_minutes(using: str | None = None, now_us: int | None = None) -> int:
    """Sum the processing records of the minutes that ended :data:`ROLLUP_LAG_SECONDS` ago
    and are not rolled up yet (at most :data:`ROLLUP_MINUTES`; the first time, the last
    hour) per queue into ``sluice_queue_minute``, and move the mark, in one transaction;
    returns the rows written.  A record that lands in a minute already rolled up (a worker
    whose clock runs minutes behind) stays out of the minutes, not out of the records."""
    using = using or get_settings().DATABASE
    now = database_now_us(using) if now_us is None else now_us
    target = (now - ROLLUP_LAG_SECONDS * US) // MINUTE * MINUTE
    mark = RollupMark.objects.using(using).filter(name=ROLLUP).first()
    start = mark.until_us if mark is not None else target - ROLLUP_MINUTES * MINUTE
    until = min(target, start + ROLLUP_MINUTES * MINUTE)
    if until <= start:
        return 0
    sums: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0] * 8)
    for queue, index, outcome, n, processing, critical_n, critical, skewed in counts_query(
            None, start, Period("rollup", start, until, 60, False, now)):
        row = sums[(queue, start + index * MINUTE)]
        row[0] += n
        row[1] += n if outcome == schema.RETRIED else 0
        row[2] += n if outcome in schema.FAILURES else 0
        if outcome in schema.HANDLER_RAN:
            row[3] += int(processing or 0)
            row[4] += n
        row[5] += int(critical or 0)
        row[6] += critical_n
        row[7] += skewed
    rows = [QueueMinute(queue=queue, minute_us=minute, **dict(zip(SUMS, r))) for (queue, minute), r in sums.items()]
    _write(QueueMinute, rows, ROLLUP, mark, start, until, using)
    return len(rows)


def roll_up_hours(using: str | None = None) -> int:
    """Sum the minutes of the whole hours the minutes' roll-up has passed and that are not
    rolled up yet (at most :data:`ROLLUP_HOURS`; the first time, from the hour of the oldest
    minute) per queue into ``sluice_queue_hour``, and move the mark, in one transaction;
    returns the rows written.  An hour is summed once, when its last minute is: minutes are
    never changed after their roll-up, so neither is an hour."""
    using = using or get_settings().DATABASE
    marks = dict(RollupMark.objects.using(using).filter(name__in=[ROLLUP, HOURS_ROLLUP])
                 .values_list("name", "until_us"))
    if ROLLUP not in marks:
        return 0
    target = marks[ROLLUP] // HOUR * HOUR
    mark = marks.get(HOURS_ROLLUP)
    if mark is None:
        oldest = QueueMinute.objects.using(using).order_by("minute_us").values_list("minute_us", flat=True).first()
        start = target if oldest is None else oldest // HOUR * HOUR
    else:
        start = mark
    until = min(target, start + ROLLUP_HOURS * HOUR)
    if until <= start:
        return 0
    hour = ExpressionWrapper((F("minute_us") - Value(start)) / Value(HOUR), output_field=BigIntegerField())
    summed = (QueueMinute.objects.using(using).filter(minute_us__gte=start, minute_us__lt=until)
              .annotate(hour=hour).order_by().values_list("queue", "hour")
              .annotate(*(Sum(name) for name in SUMS)))
    rows = [QueueHour(queue=queue, hour_us=start + index * HOUR, **dict(zip(SUMS, (int(v) for v in sums))))
            for queue, index, *sums in summed]
    _write(QueueHour, rows, HOURS_ROLLUP, mark, start, until, using)
    return len(rows)


def _write(model: type, rows: list, name: str, mark: Any, start: int, until: int, using: str) -> None:
    """Insert a roll-up's rows and move its mark from ``start`` to ``until`` in one
    transaction; a mark another roll-up moved first rolls the rows back."""
    with transaction.atomic(using=using):
        model.objects.using(using).bulk_create(rows)
        if mark is None:
            RollupMark.objects.using(using).create(name=name, until_us=until)
        elif not RollupMark.objects.using(using).filter(name=name, until_us=start).update(until_us=until):
            raise DatabaseError("another roll-up moved the mark first")  # rolls these rows back


def delete_old_minutes(retention_seconds: float, using: str | None = None) -> int:
    """Delete at most :data:`DELETE_BATCH` minutes and as many hours older than the retention."""
    using = using or get_settings().DATABASE
    cutoff = database_now_us(using) - int(retention_seconds * 1_000_000)
    deleted = 0
    for model, at in ((QueueMinute, "minute_us"), (QueueHour, "hour_us")):
        old = list(model.objects.using(using).filter(**{f"{at}__lt": cutoff}).order_by(at)
                   .values_list("pk", flat=True)[:DELETE_BATCH])
        deleted += model.objects.using(using).filter(pk__in=old).delete()[0] if old else 0
    return deleted


class QueueSampler:
    """The loop (see the module doc)."""

    name = "queue-sampler"

    def __init__(self, interval: float | None = None, lease_seconds: float | None = None) -> None:
        s = get_settings()
        self.interval = interval or s.MONITORING_SAMPLE_INTERVAL
        self.retention = s.MONITORING_SAMPLE_RETENTION
        self.lease = Lease(LEASE_NAME, lease_seconds or max(30.0, self.interval * 3), s.DATABASE)
        self.written = 0
        self.rolled_up = 0
        self._previous_us: int | None = None

    def step(self) -> float:
        if not self.lease.acquire():
            return min(self.interval, self.lease.follower_wait())
        started = time.monotonic()
        written, self._previous_us = sample_now(self.lease.using, self._previous_us)
        self.written += written
        self.rolled_up += roll_up_minutes(self.lease.using, self._previous_us)
        roll_up_hours(self.lease.using)
        delete_old_samples(self.retention, self.lease.using)
        delete_old_minutes(self.retention, self.lease.using)
        # The next sample one interval after this one began, however long the step took.
        return max(0.0, self.interval - (time.monotonic() - started))

    def close(self) -> None:
        try:
            self.lease.release()
        except Exception:  # noqa: BLE001 — the lease lapses by itself
            log.debug("queue sampler lease not released", exc_info=True)
