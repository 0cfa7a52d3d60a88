"""The monitoring tab's part of the dashboard benchmark (benchmarks/dashboard.py calls it).

:func:`fill` writes ``--monitoring-records`` processing records (default 10,000,000) over the
last 24 hours (SLUICE_RECORDS_RETENTION's day) across the benchmark's queues, two days of
queue-length samples every 10 s per queue, the day's records summed per queue and minute and
per queue and hour (as the sampler leaves them), seven days of hourly metric windows and a few deploy markers, with ``INSERT … SELECT`` over a generated series (PostgreSQL
``generate_series``, SQLite a recursive CTE), untimed.  :func:`measure` then times, through
the logged-in test client:

- ``monitoring``: ``/monitoring/`` (the default period, 5 minutes, 50 queues);
- ``monitoring_1h``: ``/monitoring/?period=1h``;
- ``monitoring_queue``: one queue's drill-down over the hour (by message type and worker);
- ``monitoring_range``: ``/monitoring/?period=range`` over the last 7 days (windows + records);
- ``api_monitoring``: ``/api/monitoring/``.

Result keys: ``<name>_ms_p95`` and ``<name>_ms_p50``, and ``monitoring_records``.  Aim: p95 ≤ 150 ms.
"""
from __future__ import annotations

import argparse
import datetime as dt
from typing import Any, Callable

from benchmarks.common import BenchmarkError, Progress, log

RECORDS = 10_000_000
#: Rows per INSERT … SELECT (a progress line each).
CHUNK = 500_000
SPAN_SECONDS = 24 * 3600
SAMPLE_SECONDS = 10
SAMPLE_SPAN = 2 * 24 * 3600
WINDOW_DAYS = 7
TYPES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--monitoring-records", type=int, default=RECORDS, metavar="N",
                        help=f"processing records for the monitoring tab (default {RECORDS:,}; 0: not measured)")


def _sql(vendor: str) -> tuple[str, Callable[[str], str]]:
    """(a FROM clause of the integers g from %s to %s, the queue name of a number's SQL) for
    this database: bench_q000 …, as benchmarks/dashboard.py names its queues."""
    if vendor == "postgresql":
        return "generate_series(%s::bigint, %s::bigint) AS g", lambda n: f"'bench_q' || lpad(({n})::text, 3, '0')"
    if vendor == "sqlite":
        return ("(WITH RECURSIVE s(g) AS (SELECT %s UNION ALL SELECT g + 1 FROM s WHERE g < %s) SELECT g FROM s)",
                lambda n: f"'bench_q' || substr('00' || CAST(({n}) AS TEXT), -3, 3)")
    raise BenchmarkError(f"no generated series for {vendor}")


def fill(records: int, queues: list[str]) -> None:
    """Records, samples, windows and markers (see the module doc); nothing when ``records`` is 0."""
    from django.db import connection, transaction

    from core.db import database_now_us
    from core.models.monitoring import RollupMark
    from core.monitoring.queue_samples import roll_up_hours, roll_up_minutes
    from core.models.records import MetricWindow
    from dashboard.models import DeployMarker

    if records <= 0:
        return
    series, queue_of = _sql(connection.vendor)
    now = database_now_us()
    start = now - SPAN_SECONDS * 1_000_000
    step = SPAN_SECONDS * 1_000_000 // records
    q = len(queues)
    # In time order, as pumps append them: 2 % retried, 0.5 % failed, the rest processed;
    # processing 0.5–20 ms, critical time 5–55 ms, four message types, four workers.
    statement = (
        "INSERT INTO sluice_processing_record (message_id, message_type, queue, endpoint, time_sent_us, started_us, "
        "ended_us, outcome, attempt, worker) "
        f"SELECT 'm' || g, 'Bench.Type' || (g %% {TYPES}), {queue_of(f'g %% {q}')}, 'bench', "
        "%s + g * %s - 5000 - (g %% 50) * 1000, %s + g * %s - 500 - (g %% 20) * 1000, %s + g * %s, "
        "CASE WHEN g %% 50 = 0 THEN 'retried' WHEN g %% 200 = 1 THEN 'failed' ELSE 'processed' END, 1, "
        f"'bench-host:' || (g %% 4) FROM {series}")
    progress = Progress("filling processing records", records)
    with connection.cursor() as cursor:
        for first in range(1, records + 1, CHUNK):
            last = min(first + CHUNK - 1, records)
            with transaction.atomic():
                cursor.execute(statement, [start, step, start, step, start, step, first, last])
            progress.update(last)
    progress.done()
    samples = SAMPLE_SPAN // SAMPLE_SECONDS * q
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO sluice_queue_sample (queue, at_us, length, estimated, grain) "
            f"SELECT {queue_of(f'g %% {q}')}, %s - (g / {q}) * %s, (g * 7) %% 1000, %s, "
            f"CASE WHEN (g / {q}) %% 360 = 0 THEN 3 WHEN (g / {q}) %% 60 = 0 THEN 2 WHEN (g / {q}) %% 6 = 0 THEN 1 "
            f"ELSE 0 END FROM {series}",
            [now, SAMPLE_SECONDS * 1_000_000, False, 0, samples - 1])
    # The day's minutes summed, as a sampler running all day leaves them (untimed).
    RollupMark.objects.create(name="queue-minutes", until_us=start // 60_000_000 * 60_000_000)
    minutes = rolled = roll_up_minutes(now_us=now)
    while rolled:
        rolled = roll_up_minutes(now_us=now)
        minutes += rolled
    hours = rolled = roll_up_hours()
    while rolled:
        rolled = roll_up_hours()
        hours += rolled
    log(f"monitoring: {minutes:,} queue minutes and {hours:,} queue hours rolled up")
    first_hour = dt.datetime.fromtimestamp(now // 3_600_000_000 * 3600, dt.timezone.utc)
    windows = [MetricWindow(queue=name, message_type=f"Bench.Type{t}", window_seconds=3600, messages=1000,
                            window_start=first_hour - dt.timedelta(hours=h), throughput_per_s=1000 / 3600,
                            processing_ms_p50=5, processing_ms_p95=15, processing_ms_p99=19, critical_ms_p50=20,
                            critical_ms_p95=50, critical_ms_p99=54, failure_rate=0.02, failures=20, retries=20)
               for h in range(1, WINDOW_DAYS * 24 + 1) for name in queues for t in range(TYPES)]
    MetricWindow.objects.bulk_create(windows, batch_size=5000)
    for hours_ago in (30, 6, 1):
        DeployMarker.objects.create(at=dt.datetime.fromtimestamp(now / 1e6 - hours_ago * 3600, dt.timezone.utc),
                                    label=f"v1.{40 - hours_ago}", username="bench")
    log(f"monitoring: {records:,} records, {samples:,} queue samples, {len(windows):,} hourly windows")


def measure(client: Any, queue: str, requests: int, time_get: Callable[..., dict[str, float]]) -> dict[str, Any]:
    """Time the tab's pages (see the module doc); ``time_get`` is the dashboard benchmark's."""
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=7)).strftime("%Y-%m-%dT%H:%M")
    urls = {"monitoring": "/monitoring/", "monitoring_1h": "/monitoring/?period=1h",
            "monitoring_queue": f"/monitoring/{queue}/?period=1h",
            "monitoring_range": f"/monitoring/?period=range&from={start}", "api_monitoring": "/api/monitoring/"}
    result: dict[str, Any] = {}
    for name, url in urls.items():
        timing = time_get(client, url, requests)
        log(f"{name} {url}: p50 {timing['p50']:.1f} ms, p95 {timing['p95']:.1f} ms, max {timing['max']:.1f} ms")
        result[f"{name}_ms_p95"], result[f"{name}_ms_p50"] = timing["p95"], timing["p50"]
    return result
