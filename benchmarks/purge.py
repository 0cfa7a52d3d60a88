"""Purging expired messages while receivers run: purge speed, receiver slowdown, deadlocks.

    python -m benchmarks purge --db postgresql|sqlite [--expired N] [--live L] [--receivers R] [--window S]

The ``demo`` queue is filled with N expired rows and L live ``Ping`` rows, the live ones
spread evenly through the table in RowVersion order (every k-th row, k = (N + L) // L).
On PostgreSQL the rows are built by a benchmark-only ``INSERT … SELECT … FROM
generate_series(…)`` (in chunks, for progress), laid out as ``Transport.send`` lays them
out: Id = gen_random_uuid(), the same headers (``NServiceBus.MessageId`` = the Id text,
``EnclosedMessageTypes`` = ``Ping``; the expired ones also carry ``TimeToBeReceived``),
Recoverable, Body ``{}``, Expires = now − 1 hour for expired rows and NULL for live ones.
On SQLite ``Transport.build`` makes every row (SQLite is only here for completeness: it
has one writer at a time, so the purge and the receivers take turns).  Then
``VACUUM (ANALYZE)`` (PostgreSQL; autovacuum may be off on the server, and a vacuum
either before both phases or before neither keeps them comparable), ``ANALYZE`` on SQLite.

Both phases start from the same table state: the table is emptied (``TRUNCATE …
RESTART IDENTITY``) and filled again between them.  Two queues filled alike would not
do: the ``Ping`` handler is registered for ``demo`` only.

1. *baseline*: one ``sluice worker --queue demo --concurrency R --no-mover`` process runs
   for ``--window`` seconds (default 10) with nobody purging.  Its receivers take rows
   from the head of the queue, expired ones included (the receive returns them with
   ``expired`` set and the pump drops them — part of the real workload).
   ``baseline_live_per_s`` = rows added to ``sluice_demo_ping`` per second in the window;
   ``baseline_rows_per_s`` = rows the worker received (live + expired) per second
   serving (its closing stats line).  The Pings handled so far must each be a distinct
   live message that is no longer in the queue.
2. *purge*: the same worker again, and in this process ``purge_expired_messages()``
   (batches of ≤ 4,000, skip-locked) called until no expired row is left.
   ``purged_per_s`` = rows the purge removed / its wall time;
   ``during_purge_live_per_s`` = Pings handled per second while it ran;
   ``receiver_drop_pct`` = 100 × (baseline − during) / baseline (negative: the receivers
   got faster, e.g. because the purge took the expired rows out of their way).  Then the
   worker stops and a ``--until-empty`` worker drains the rest (``drain_live_per_s``:
   receivers on live rows only, nobody purging — a reference for what the receivers do
   without expired rows in their way): every live message must have been handled
   exactly once, ``demo`` and ``error`` must be empty.

Deadlocks: ``deadlocks`` = the larger of ``pg_stat_database.deadlocks`` growth for the
benchmark database from the start of the purge phase to the end of the drain, and the
deadlock errors (``deadlock`` / ``40P01``) seen in any worker's output and in the
purge's exceptions.  Lock waits: a monitor samples ``pg_stat_activity`` every
``--monitor-interval`` seconds (default 0.02) and counts samples in which the purge's
backend, or a receiver's, waited on a heavyweight lock (``wait_event_type = 'Lock'``).
Per-batch purge times come from the ``sluice.transport`` log records ("purged N expired
messages", one per batch).

The worker runs with ``SLUICE_LOG_LEVEL=WARNING``: at INFO it logs one line per
expired message it drops (a million lines here), which would flood the pipe this
benchmark reads.  PostgreSQL runs use a database of their own, ``sluice_bench_purge``
(``<SLUICE_BENCH_DATABASE>_purge`` when that is set).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import time
from typing import Any

from benchmarks import common
from benchmarks.common import (
    BenchmarkError, Progress, Worker, database_version, log, positive_int, rate, standard_main, setup_django,
    worker_env,
)
from benchmarks.purge_fill import LIVE_TABLE, QUEUE, fill, live_stride
from benchmarks.purge_watch import DATABASE_NAME, BatchLog, LockMonitor, PingSampler, ping_rows

HELP = "purge of expired rows while receivers run: purge speed, receiver slowdown, deadlocks"
#: Defaults per database: (expired N, live L).
DEFAULT_SIZES = {"postgresql": (1_000_000, 20_000), "sqlite": (200_000, 4_000)}
DEADLOCK_MARKERS = ("deadlock", "40p01")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # common.add_database_argument would name common's database; this one uses its own.
    parser.add_argument("--db", choices=common.DATABASES, required=True,
                        help=f"sqlite: a temporary file; postgresql: a fresh database {DATABASE_NAME!r} "
                             f"on the server of ${common.POSTGRES_URL_ENV} (default {common.DEFAULT_POSTGRES_URL})")
    parser.add_argument("--expired", type=positive_int, default=None, metavar="N",
                        help="expired rows (default 1,000,000 on postgresql, 200,000 on sqlite)")
    parser.add_argument("--live", type=positive_int, default=None, metavar="L",
                        help="live Ping rows spread among them (default 20,000 on postgresql, 4,000 on sqlite)")
    parser.add_argument("--receivers", type=positive_int, default=4, metavar="R",
                        help="the worker's --concurrency (default 4; SQLite pumps use 1 thread whatever R is)")
    parser.add_argument("--window", type=float, default=10.0, metavar="S",
                        help="seconds the baseline worker runs (default 10)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="purge batch size (default SLUICE_PURGE_BATCH_SIZE; the purge caps it at 4000)")
    parser.add_argument("--monitor-interval", type=float, default=0.02, metavar="S",
                        help="how often pg_stat_activity is sampled for lock waits (default 0.02)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up on the purge or the final drain after S seconds (default 120 + (N+L)/2000)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("purge", HELP, add_arguments, run, argv)


def pg_deadlocks() -> int:
    """pg_stat_database.deadlocks of the benchmark database, read on a fresh connection
    (no cached stats snapshot)."""
    import psycopg

    with psycopg.connect(common.server_url(), autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
    return int(row[0]) if row else 0


# -- measuring ---------------------------------------------------------------------------------
def parse_stats(line: str | None) -> dict[str, int]:
    import re

    if not line:
        return {}
    return {key.replace(" ", "_"): int(value)
            for key, value in re.findall(r"(received|handled|retried|to error|expired|poison) (\d+)", line)}


def explain(kind: str, size: int, analyze: bool = False) -> list[str]:
    """The plan of the purge statement (ANALYZE: run in a transaction that is rolled back)."""
    from django.db import connection, transaction

    from core.transport import Transport

    d = Transport().dialect
    sql = d.purge_expired(QUEUE)
    if kind == "sqlite":
        prefix = "EXPLAIN QUERY PLAN "
    else:
        prefix = "EXPLAIN (ANALYZE, BUFFERS) " if analyze else "EXPLAIN "
    lines: list[str] = []
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(prefix + sql, [size])
                lines = [" | ".join(str(c) for c in row) for row in cursor.fetchall()]
            transaction.set_rollback(True)
    except Exception as exc:
        lines = [f"EXPLAIN failed: {exc}"]
    return lines


def deadlock_mentions(lines: list[str]) -> int:
    return sum(1 for line in lines if any(m in line.lower() for m in DEADLOCK_MARKERS))


def verify_partial(live: int, handled: int, phase: str) -> None:
    """After the baseline: each handled Ping once, each a live message no longer queued,
    and every other live message still queued."""
    from django.db import connection

    from core.transport import Transport

    t = Transport().dialect.table(QUEUE)
    id_text = '"Id"' if connection.vendor == "sqlite" else '"Id"::text'
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM sluice_demo_ping")
        rows, distinct = cursor.fetchone()
        cursor.execute(f"SELECT COUNT(*) FROM sluice_demo_ping WHERE message_id NOT IN (SELECT id FROM {LIVE_TABLE})")
        strangers = cursor.fetchone()[0]
        cursor.execute(f'SELECT COUNT(*) FROM {t} WHERE "Expires" IS NULL')
        queued = cursor.fetchone()[0]
        cursor.execute(f'SELECT COUNT(*) FROM {t} WHERE {id_text} IN (SELECT message_id FROM sluice_demo_ping)')
        both = cursor.fetchone()[0]
    problems = []
    if rows != distinct:
        problems.append(f"{rows - distinct} duplicate Ping(s)")
    if strangers:
        problems.append(f"{strangers} handled id(s) that are not live messages")
    if both:
        problems.append(f"{both} handled message(s) still in the queue")
    if distinct + queued != live:
        problems.append(f"{distinct} handled + {queued} queued live messages != {live}")
    if handled is not None and handled != rows:
        problems.append(f"worker says it handled {handled}, sluice_demo_ping has {rows}")
    if problems:
        raise BenchmarkError(f"{phase}: " + "; ".join(problems))


def verify_final(live: int) -> dict[str, int]:
    from django.db import connection

    from core.transport import Transport

    transport = Transport()
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT message_id) FROM sluice_demo_ping")
        rows, distinct = cursor.fetchone()
        cursor.execute(f"SELECT COUNT(*) FROM {LIVE_TABLE} WHERE id NOT IN (SELECT message_id FROM sluice_demo_ping)")
        lost = cursor.fetchone()[0]
    left, errors = transport.counts(QUEUE).total, transport.counts("error").total
    result = {"lost": lost, "duplicates": rows - distinct, "left_in_queue": left, "in_error_queue": errors}
    if lost or rows != distinct or distinct != live or left or errors:
        raise BenchmarkError(f"final check: {rows} Pings handled ({distinct} distinct) of {live} live; {result}")
    return result


def expired_left() -> int:
    """Expired rows still in the queue (through the partial Expires index, not a table count)."""
    from django.db import connection

    from core.transport import Transport

    d = Transport().dialect
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM {d.table(QUEUE)} WHERE "Expires" IS NOT NULL '
                       f'AND "Expires" <= {d.now_sql()}', [])
        return cursor.fetchone()[0]


# -- the benchmark -----------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    kind = args.db
    n = args.expired or DEFAULT_SIZES[kind][0]
    live = args.live or DEFAULT_SIZES[kind][1]
    r = args.receivers
    timeout = args.timeout or 120 + (n + live) / 2000
    run_started = time.perf_counter()
    with common.bench_database(kind, DATABASE_NAME) as url:
        setup_django(url)
        from django.db import connection, connections

        from core.conf import get_settings
        from core.expiry import purge_expired_messages

        version = database_version()
        env = worker_env(url, {"SLUICE_LOG_LEVEL": "WARNING"})
        worker_args = ["--queue", QUEUE, "--concurrency", str(r), "--no-mover"]
        batch_size = min(args.batch_size or get_settings().PURGE_BATCH_SIZE, 4000)
        log(f"{kind} {version}: {n} expired + {live} live rows (every {live_stride(n, live)}th row live), "
            f"{r} receivers, purge batch {batch_size}")

        # -- 1. baseline ------------------------------------------------------------------------
        fill_s = [fill(kind, n, live, "fill (baseline)")]
        if kind == "postgresql":
            for line in explain(kind, batch_size):
                log(f"plan (fresh table): {line}")
        log(f"baseline: worker with {r} receivers for {args.window:g} s, no purge")
        sampler = PingSampler()
        with Worker(worker_args, env, "baseline worker") as worker:
            worker.wait_ready(60)
            sampler.start()
            b0 = time.perf_counter()
            p0 = ping_rows()
            time.sleep(args.window)
            p1 = ping_rows()
            b1 = time.perf_counter()
            worker.terminate()
        sampler.stop()
        baseline_stats = parse_stats(worker.stats_line())
        baseline_serving = worker.serving_seconds()
        baseline_live_per_s = rate(p1 - p0, b1 - b0)
        baseline_rows_per_s = rate(baseline_stats.get("received", 0), baseline_serving or 0)
        baseline_trouble = worker.trouble()
        baseline_output = worker.stderr + worker.stdout
        log(f"baseline: {p1 - p0} Pings in {b1 - b0:.1f} s = {baseline_live_per_s or 0:.0f} live/s; "
            f"worker: {baseline_stats} in {baseline_serving or 0:.1f} s serving = "
            f"{baseline_rows_per_s or 0:.0f} rows/s; live/s per second: {sampler.per_second(b0, b1)}")
        if baseline_stats.get("received", 0) >= n + live:
            log("warning: the baseline worker emptied the queue within the window, so baseline_live_per_s "
                "includes idle time; use more --expired or a shorter --window")
        verify_partial(live, baseline_stats.get("handled"), "baseline")
        analyzed_plan = explain(kind, batch_size, analyze=True) if kind == "postgresql" else []
        for line in analyzed_plan:
            log(f"plan (after baseline, EXPLAIN ANALYZE rolled back): {line}")

        # -- 2. purge with the receivers running ------------------------------------------------------
        fill_s.append(fill(kind, n, live, "fill (purge phase)"))
        plan = explain(kind, batch_size)
        for line in plan:
            log(f"plan (purge phase, fresh table): {line}")
        connections.close_all()
        deadlocks_before = pg_deadlocks() if kind == "postgresql" else 0
        connection.ensure_connection()
        purge_pid = connection.connection.info.backend_pid if kind == "postgresql" else None
        batch_log = BatchLog()
        transport_logger = logging.getLogger("sluice.transport")
        transport_logger.addHandler(batch_log)
        saved_propagate, transport_logger.propagate = transport_logger.propagate, False
        purge_errors: list[str] = []
        purged = calls = 0
        sampler = PingSampler()
        monitor = LockMonitor(purge_pid, args.monitor_interval) if kind == "postgresql" else None
        log(f"purge phase: worker with {r} receivers, purge_expired_messages(batch_size={batch_size}) "
            f"until no expired row is left")
        try:
            with Worker(worker_args, env, "purge-phase worker") as worker:
                worker.wait_ready(60)
                sampler.start()
                if monitor:
                    monitor.start()
                progress = Progress("purge", n)
                q0 = ping_rows()
                t0 = time.perf_counter()
                call_starts = []
                while True:
                    if time.perf_counter() - t0 > timeout:
                        raise BenchmarkError(f"purge: still expired rows after {timeout:g} s")
                    call_starts.append(time.perf_counter())
                    try:
                        removed = purge_expired_messages(batch_size=batch_size)
                    except Exception as exc:
                        purge_errors.append(f"{type(exc).__name__}: {exc}")
                        log(f"purge raised {purge_errors[-1]}")
                        connections.close_all()
                        continue
                    calls += 1
                    got = removed.get(QUEUE, 0)
                    purged += got
                    progress.update(purged)
                    if got == 0 or got < batch_size:
                        if expired_left() == 0:
                            break
                        time.sleep(0.01)  # receivers hold the last few: try again
                t1 = time.perf_counter()
                q1 = ping_rows()
                progress.done(f"{purged} purged in {calls} call(s)")
                worker.terminate()
        finally:
            transport_logger.removeHandler(batch_log)
            transport_logger.propagate = saved_propagate
            sampler.stop()
            if monitor:
                monitor.stop()
        purge_s = t1 - t0
        during_stats = parse_stats(worker.stats_line())
        during_serving = worker.serving_seconds()
        during_live_per_s = rate(q1 - q0, purge_s)
        during_rows_per_s = rate(during_stats.get("received", 0), during_serving or 0)
        purge_trouble = worker.trouble()
        log(f"purge: {purged} rows in {purge_s:.2f} s = {rate(purged, purge_s) or 0:.0f}/s; receivers: "
            f"{q1 - q0} Pings = {during_live_per_s or 0:.0f} live/s; worker: {during_stats} in "
            f"{during_serving or 0:.1f} s serving; live/s per second: {sampler.per_second(t0, t1)}")

        # per-batch times: gaps between consecutive batch records (the first of a call: from its start)
        marks = sorted([(t, "call") for t in call_starts] + [(t, "batch") for t, _ in batch_log.records])
        batch_ms, previous = [], None
        for when, what in marks:
            if what == "batch" and previous is not None:
                batch_ms.append((when - previous) * 1000)
            previous = when
        batches = {
            "count": len(batch_log.records),
            "p50_ms": statistics.median(batch_ms) if batch_ms else None,
            "p95_ms": sorted(batch_ms)[max(math.ceil(0.95 * len(batch_ms)) - 1, 0)] if batch_ms else None,
            "max_ms": max(batch_ms) if batch_ms else None,
            "first5_ms": batch_ms[:5],
            "last5_ms": batch_ms[-5:],
        }
        log(f"purge batches: {batches}")
        if monitor:
            log(f"lock monitor: {monitor.record()}")
            for line in monitor.examples:
                log(f"  lock wait: {line}")

        # -- 3. the rest, and the checks ---------------------------------------------------------------
        left = live - ping_rows()
        log(f"drain: {left} live message(s) left; worker --until-empty")
        with Worker([*worker_args, "--until-empty"], env, "drain worker") as drainer:
            drain_s = drainer.wait(timeout)
        drain_stats = parse_stats(drainer.stats_line())
        drain_serving = drainer.serving_seconds()
        # Receivers on live rows only, nobody purging (includes the until-empty check at the end).
        drain_live_per_s = (rate(drain_stats["handled"], drain_serving or 0)
                            if drain_stats.get("handled") else None)
        log(f"drain: {drain_s:.1f} s ({drain_serving or 0:.1f} s serving = {drain_live_per_s or 0:.0f} live/s); "
            f"worker: {drain_stats}")
        checks = verify_final(live)

        connections.close_all()
        time.sleep(0.5)
        pg_delta = pg_deadlocks() - deadlocks_before if kind == "postgresql" else 0
        mentions = (deadlock_mentions(baseline_output + worker.stderr + worker.stdout + drainer.stderr + drainer.stdout)
                    + deadlock_mentions(purge_errors))
        deadlocks = max(pg_delta, mentions)
        trouble = baseline_trouble + purge_trouble + drainer.trouble()
        if trouble:
            log(f"{len(trouble)} worker stderr line(s) looked like trouble (shown above)")
        receiver_drop_pct = (100 * (baseline_live_per_s - during_live_per_s) / baseline_live_per_s
                             if baseline_live_per_s and during_live_per_s is not None else None)
        total_s = time.perf_counter() - run_started
        log(f"total run time {total_s:.0f} s; load average {os.getloadavg()}")
        return {
            "benchmark": "purge",
            "db": kind,
            "db_version": version,
            "expired": n,
            "live": live,
            "receivers": r,
            "purge_batch_size": batch_size,
            "purged_per_s": rate(purged, purge_s),
            "receiver_drop_pct": receiver_drop_pct,
            "deadlocks": deadlocks,
            "baseline_live_per_s": baseline_live_per_s,
            "during_purge_live_per_s": during_live_per_s,
            "baseline_rows_per_s": baseline_rows_per_s,
            "during_purge_rows_per_s": during_rows_per_s,
            "purged": purged,
            "purge_s": purge_s,
            "purge_calls": calls,
            "purge_errors": len(purge_errors),
            "purge_batches": batches,
            "pg_stat_deadlocks_delta": pg_delta if kind == "postgresql" else None,
            "deadlock_mentions": mentions,
            "lock_monitor": monitor.record() if monitor else None,
            "purge_plan": plan,
            "window_s": b1 - b0,
            "baseline_worker": baseline_stats,
            "purge_phase_worker": during_stats,
            "drain_worker": drain_stats,
            "drain_s": drain_s,
            "drain_live_per_s": drain_live_per_s,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "fill_s": fill_s,
            "worker_trouble_lines": len(trouble),
            **checks,
            "total_s": total_s,
        }
