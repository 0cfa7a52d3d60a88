"""Delayed delivery: how late due messages reach their handler, and how late the mover
forwards them to their queue.

    python -m benchmarks delayed --db sqlite|postgresql [--messages N] [--rate R] [--lead S]

One ``sluice worker --queue demo`` process (the real delayed-message mover plus the
``demo`` pump) serves both phases:

1. *paced*: N ``Ping`` messages are stored with ``deliver_at=`` exact instants (whole
   milliseconds) R per second apart, the first one ``--lead`` seconds (default 3) after
   storing is expected to end.  All of them are stored before any is due, in batches of
   ``STORE_BATCH`` per transaction, so storing speed does not enter the measurement.
   Per message, lateness = the handler's start (``handled_at`` of its
   ``sluice_demo_ping`` row, the pump's clock) − its due instant → ``lateness_ms_p50`` /
   ``_p99`` / ``_max`` (the same as ``handled_lateness_ms_*``).  The mover's own figure,
   ``Sluice.DeliveredAt`` (its wall clock when it forwarded the message, just before its
   batch commits) − due, is ``forward_lateness_ms_*`` (earlier versions called it
   ``lateness_ms_*``).  ``early`` counts messages forwarded or handled before their due
   instant, ``duplicates`` message ids handled more than once.
   ``paced_moved_per_s`` = N / (last − first DeliveredAt) only shows that the mover kept
   up with R.
2. *burst*: M (default N) more Pings, all due at one instant → ``moved_per_s`` =
   M / (last − first DeliveredAt), the mover's top speed (with the pump handling what it
   moves at the same time, in the same process).

How the DeliveredAt headers are read: the pump takes messages off ``demo`` as soon as
they land, so the benchmark puts an ``AFTER INSERT`` trigger on the ``demo`` table
that copies each landed row's Id and Headers into ``bench_landed`` (same transaction
as the mover's insert; one extra row insert per moved message), read after each phase.
``handled_lateness_ms_*`` (= ``lateness_ms_*``) use ``handled_at`` of the
``sluice_demo_ping`` rows (the pump's clock in the handler, before its commit).

The demo's ``Ping`` handler is a batch handler (core/demo/handlers.py): the Pings of one
receive chunk are written in one INSERT, and every row of it carries that INSERT's
``handled_at``.  At 1,000/s the mover forwards about six messages per commit; with a
per-message handler the sixth waited for five ORM round trips before its own started,
which was most of the handler lateness (figures in the README).  A per-message handler
that writes one row each pays that queueing on top.

Nothing polls the database while messages are due: the run sleeps until a phase's last
due instant, then checks its counts every ``WAIT_POLL`` seconds.  Only with
``--poll-interval S`` (e.g. 0.005) does a poller thread in this process read new ``bench_landed``
rows every S seconds (earlier versions always did, every 5 ms) and note when it first
saw each: ``visible_lateness_ms_*`` = that moment − due, i.e. when the mover's commit
became visible to others (resolution: the poll interval plus one query).  Without it
the ``visible_*`` keys (and ``burst_visible_*``, ``poll_query_ms``) are null and
``visibility_poller`` is false: 200 queries a second from another process on a 2-core
machine show up in the handler's figure.

The run waits until ``sluice_demo_ping`` holds N (then N + M) rows, then checks that
every scheduled message landed exactly once, nothing is left in the delayed store,
``demo`` or ``error``.  Early or duplicated messages still print the JSON line (with
their counts) but exit with status 1.

``--delayed-batch-size`` and ``--peek-delay`` set ``SLUICE_DELAYED_BATCH_SIZE`` and
``SLUICE_PEEK_DELAY`` for the worker (default: leave them alone; the pump shares the
database, the CPU, the GIL and on SQLite the write lock with the mover, so its pace
shows in the mover's lateness).  ``--samples PATH`` writes one JSON line per landed
message for plotting.  ``load_avg_before`` / ``_after`` record the machine's load:
other work on a small machine shows up directly as lateness.

PostgreSQL runs use a database of their own, ``sluice_bench_delayed``, so the transport
benchmark (``sluice_bench``) can run at the same time.
"""
from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import time
from typing import Any

from benchmarks import common
from benchmarks.common import (
    BenchmarkError, Progress, Worker, database_version, emit_result, log,
    positive_int, rate, run_main, setup_django, worker_env,
)
from benchmarks.delayed_landing import (
    QUEUE, LandingPoller, install_landing_probe, landed_count, percentile, phase_stats, read_landed, summary,
    write_samples,
)

HELP = "lateness of delayed messages (paced at R/s) and the mover's burst speed"
MESSAGE_TYPE = "Ping"
DATABASE_NAME = f"{common.BENCH_DATABASE}_delayed"  # sluice_bench_delayed unless SLUICE_BENCH_DATABASE says
#: Messages stored per transaction while scheduling.
STORE_BATCH = 250
#: Sends timed (and rolled back) to estimate how long storing N messages takes.
CALIBRATION_SENDS = 200
WAIT_POLL = 0.05


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # common.add_database_argument would name common's database; this one uses its own.
    parser.add_argument("--db", choices=common.DATABASES, required=True,
                        help=f"sqlite: a temporary file; postgresql: a fresh database {DATABASE_NAME!r} "
                             f"on the server of ${common.POSTGRES_URL_ENV} (default {common.DEFAULT_POSTGRES_URL})")
    parser.add_argument("--messages", type=positive_int, default=3000, metavar="N",
                        help="messages in the paced phase (default 3000)")
    parser.add_argument("--rate", type=positive_float, default=1000.0, metavar="R",
                        help="due instants per second in the paced phase (default 1000)")
    parser.add_argument("--burst", type=positive_int, default=None, metavar="M",
                        help="messages due at one instant in the burst phase (default N)")
    parser.add_argument("--lead", type=positive_float, default=3.0, metavar="S",
                        help="seconds between the expected end of storing and the first due instant (default 3)")
    parser.add_argument("--poll-interval", type=positive_float, default=None, metavar="S",
                        help="run the visibility poller, looking for landed messages every S seconds "
                             "(default: no poller; visible_* are null)")
    parser.add_argument("--delayed-batch-size", type=positive_int, default=None, metavar="B",
                        help="SLUICE_DELAYED_BATCH_SIZE for the worker (default: leave the setting alone)")
    parser.add_argument("--peek-delay", type=float, default=None, metavar="S",
                        help="SLUICE_PEEK_DELAY for the worker (default: leave the setting alone); it paces the "
                             "pump, which shares the database (and on SQLite the write lock) with the mover")
    parser.add_argument("--samples", metavar="PATH", default=None,
                        help="also write one JSON line per landed message (phase, id, due, delivered_at, "
                             "seen, handled_at as epoch seconds) to PATH, for plotting")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up waiting for a phase this many seconds after its last due instant "
                             "(default: 60 + N/50)")


def main(argv: list[str] | None = None) -> int:
    def body(argv):
        parser = argparse.ArgumentParser(prog="python -m benchmarks delayed", description=HELP)
        add_arguments(parser)
        result = run(parser.parse_args(argv))
        emit_result(result)
        problems = [f"{result[key]} {key.replace('_', ' ')}" for key in ("early", "duplicates", "landed_duplicates")
                    if result[key]]
        if problems:
            raise BenchmarkError("delayed delivery broke its promises: " + ", ".join(problems))

    return run_main(body, argv)


# -- helpers on the bench database (this process) ---------------------------------------------
def ping_counts() -> tuple[int, int]:
    from django.db.models import Count

    from core.demo.models import PingRecord

    totals = PingRecord.objects.aggregate(rows=Count("id"), distinct=Count("message_id", distinct=True))
    return totals["rows"], totals["distinct"]


def handled_at(ids: set[str]) -> dict[str, float]:
    from core.demo.models import PingRecord

    return {mid: when.timestamp() for mid, when in PingRecord.objects.values_list("message_id", "handled_at")
            if mid in ids}


def delayed_left() -> int:
    from core.delayed import delayed_store

    messages, _ = delayed_store().list(10)
    return len(messages)


def queue_total(name: str) -> int:
    from core.transport import Transport

    return Transport().counts(name).total


def estimate_store_rate() -> float:
    """Messages per second Transport.send(deliver_at=…) stores in batches: timed on
    CALIBRATION_SENDS sends in one transaction that is then rolled back (no notification,
    nothing stored)."""
    from django.db import transaction

    from core.transport import Transport

    class Rollback(Exception):
        pass

    transport = Transport()
    when = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    started = time.perf_counter()
    try:
        with transaction.atomic():
            for i in range(CALIBRATION_SENDS):
                transport.send(QUEUE, {"calibration": i}, message_type=MESSAGE_TYPE, deliver_at=when)
            raise Rollback
    except Rollback:
        pass
    return CALIBRATION_SENDS / (time.perf_counter() - started)


def schedule(label: str, count: int, per_second: float | None, store_rate: float, lead: float,
             offset: int) -> tuple[dict[str, float], float, float]:
    """Store ``count`` Pings due at whole-millisecond instants ``per_second`` apart (None: all
    at one instant).  Returns ({message id: due epoch}, first due epoch, slack seconds
    between the end of storing and the first due instant)."""
    from django.db import transaction

    from core.transport import Transport

    transport = Transport()
    expected = count / store_rate * 1.5 + 0.2
    first_ms = math.ceil((time.time() + expected + lead) * 1000)
    due_ms = [first_ms + (0 if per_second is None else math.floor(i * 1000 / per_second)) for i in range(count)]
    dues: dict[str, float] = {}
    progress = Progress(f"{label}: store", count)
    started = time.perf_counter()
    for start in range(0, count, STORE_BATCH):
        with transaction.atomic():
            for i in range(start, min(start + STORE_BATCH, count)):
                when = dt.datetime.fromtimestamp(due_ms[i] / 1000, dt.timezone.utc)
                mid = transport.send(QUEUE, {"n": offset + i, "phase": label}, message_type=MESSAGE_TYPE,
                                     deliver_at=when)
                dues[mid] = due_ms[i] / 1000
        progress.update(min(start + STORE_BATCH, count))
    elapsed = time.perf_counter() - started
    slack = first_ms / 1000 - time.time()
    progress.done(f"{rate(count, elapsed) or 0:.0f} msg/s; first due in {slack:.2f} s, "
                  f"last in {due_ms[-1] / 1000 - time.time():.2f} s")
    if slack < 0.5:
        log(f"warning: {label}: storing ended only {slack:.3f} s before the first due instant; "
            f"use a longer --lead")
    return dues, first_ms / 1000, slack


def wait_for_phase(label: str, worker: Worker, poller: LandingPoller | None, landed_before: int,
                   rows_before: int, count: int, last_due: float, timeout: float) -> None:
    """Until ``count`` more messages landed and ``count`` more Pings were handled.  With
    no poller, nothing is read before the phase's last due instant."""
    landed_progress = Progress(f"{label}: landed", count)
    handled_progress = Progress(f"{label}: handled", count)
    deadline = last_due + timeout
    landed_done = handled_done = False
    if poller is None:  # (+ 0.1 s: the last due messages are being handled then)
        while time.time() < last_due + 0.1 and worker.alive():
            time.sleep(min(0.2, max(last_due + 0.1 - time.time(), 0.001)))
    while True:
        if poller is not None and poller.error is not None:
            raise BenchmarkError(f"landing poller failed: {poller.error!r}")
        landed = (poller.count() if poller is not None else landed_count()) - landed_before
        rows, _ = ping_counts()
        rows -= rows_before
        if not landed_done:
            landed_progress.update(min(landed, count))
            if landed >= count:
                landed_done = True
                landed_progress.done()
        if not handled_done:
            handled_progress.update(min(rows, count))
            if rows >= count:
                handled_done = True
                handled_progress.done()
        if landed_done and handled_done:
            return
        if not worker.alive():
            raise BenchmarkError(f"worker died during {label} ({landed}/{count} landed, {rows}/{count} handled):\n"
                                 f"{worker.tail()}")
        if time.time() > deadline:
            raise BenchmarkError(f"{label}: only {landed}/{count} landed and {rows}/{count} handled "
                                 f"{timeout:g} s after the last due instant:\n{worker.tail()}")
        time.sleep(WAIT_POLL)


# -- the benchmark --------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    n, r = args.messages, args.rate
    m = args.burst or n
    timeout = args.timeout or 60 + n / 50
    load_before = os.getloadavg()[0]
    with common.bench_database(args.db, DATABASE_NAME) as url:
        setup_django(url)
        version = database_version()
        install_landing_probe()
        extra_env = {}
        if args.delayed_batch_size:
            extra_env["SLUICE_DELAYED_BATCH_SIZE"] = str(args.delayed_batch_size)
        if args.peek_delay is not None:
            extra_env["SLUICE_PEEK_DELAY"] = repr(args.peek_delay)
        env = worker_env(url, extra_env)
        poller = LandingPoller(args.poll_interval) if args.poll_interval else None
        if poller is not None:
            poller.start()
        try:
            log("starting the worker (mover + demo pump)")
            with Worker(["--queue", QUEUE], env, "worker") as worker:
                ready_s = worker.wait_ready(60)
                log(f"worker serving after {ready_s:.2f} s")
                store_rate = estimate_store_rate()
                log(f"storing runs at about {store_rate:.0f} msg/s (calibration, rolled back)")

                # 1. paced: N messages R per second
                paced_dues, paced_first, paced_slack = schedule("paced", n, r, store_rate, args.lead, 0)
                paced_last = max(paced_dues.values())
                log(f"paced: {n} messages due from {paced_first - time.time():.2f} s to "
                    f"{paced_last - time.time():.2f} s from now")
                wait_for_phase("paced", worker, poller, 0, 0, n, paced_last, timeout)
                landed_after_paced = poller.count() if poller is not None else landed_count()

                # 2. burst: M messages due at one instant
                burst_dues, burst_at, burst_slack = schedule("burst", m, None, store_rate, args.lead, n)
                wait_for_phase("burst", worker, poller, landed_after_paced, n, m, burst_at, timeout)
                time.sleep(max((args.poll_interval or 0) * 3, 0.05))  # let late duplicates show up
                landed = poller.snapshot() if poller is not None else read_landed()
                strangers = [row for row in landed if row[0] not in paced_dues and row[0] not in burst_dues]
                if strangers:
                    raise BenchmarkError(f"{len(strangers)} landed message(s) that were never scheduled")
                paced = phase_stats("paced", paced_dues, landed)
                burst = phase_stats("burst", burst_dues, landed)

                stop_s = worker.terminate()
                trouble = worker.trouble()
                stats_line = worker.stats_line()
            log(f"worker stopped {stop_s:.2f} s after SIGTERM; worker says: {stats_line}")
        finally:
            if poller is not None:
                poller.stop()

        rows, distinct = ping_counts()
        duplicates = rows - distinct
        if distinct != n + m:
            raise BenchmarkError(f"sluice_demo_ping has {distinct} distinct message ids, expected {n + m}")
        left, on_queue, on_error = delayed_left(), queue_total(QUEUE), queue_total("error")
        if left or on_queue or on_error:
            raise BenchmarkError(f"left over: {left} in the delayed store, {on_queue} on {QUEUE!r}, "
                                 f"{on_error} on 'error'")
        handled = handled_at(set(paced_dues) | set(burst_dues))
        if args.samples:
            write_samples(args.samples, landed, {"paced": paced_dues, "burst": burst_dues}, handled)
        handled_ms = [(handled[mid] - due) * 1000 for mid, due in paced_dues.items() if mid in handled]
        poll_ms = 1000 * poller.poll_seconds / poller.polls if poller is not None and poller.polls else None
        if trouble:
            log(f"{len(trouble)} worker stderr line(s) looked like trouble (shown above)")

        lateness = paced["lateness_ms"]
        burst_rate = rate(m, burst["span_s"])
        log(f"paced: lateness at the handler p50 {percentile(handled_ms, 50) or 0:.1f} ms, "
            f"p99 {percentile(handled_ms, 99) or 0:.1f} ms; forwarded p50 {percentile(lateness, 50):.1f} ms, "
            f"p99 {percentile(lateness, 99):.1f} ms, max {max(lateness):.1f} ms; burst: {m} moved in {burst['span_s'] * 1000:.0f} ms "
            f"({burst_rate or 0:.0f} msg/s)")
        return {
            "benchmark": "delayed",
            "db": args.db,
            "db_version": version,
            "messages": n,
            "rate": r,
            # At the handler (handler start − due): what a user sees, wake-ups included.
            **summary("lateness_ms", handled_ms),
            # The mover's own figure (DeliveredAt − due), the "lateness" of earlier versions.
            **summary("forward_lateness_ms", lateness),
            "early": paced["early"] + burst["early"] + sum(1 for ms in handled_ms if ms < 0),
            "duplicates": duplicates,
            "moved_per_s": burst_rate,
            "paced_moved_per_s": rate(n, paced["span_s"]),
            **summary("visible_lateness_ms", paced["visible_ms"]),
            **summary("handled_lateness_ms", handled_ms),
            "landed_duplicates": paced["landed_duplicates"] + burst["landed_duplicates"],
            "visible_early": paced["visible_early"] + burst["visible_early"] if poller is not None else None,
            "burst_messages": m,
            "burst_moved_ms": burst["span_s"] * 1000,
            "burst_first_lateness_ms": (burst["first_delivered"] - burst_at) * 1000,
            "burst_last_lateness_ms": (burst["last_delivered"] - burst_at) * 1000,
            **summary("burst_visible_lateness_ms", burst["visible_ms"]),
            "lead_s": args.lead,
            "slack_s": min(paced_slack, burst_slack),
            "store_per_s_estimate": store_rate,
            "poll_interval_ms": args.poll_interval * 1000 if args.poll_interval else None,
            "visibility_poller": poller is not None,
            "poll_query_ms": poll_ms,
            "delayed_batch_size": args.delayed_batch_size,
            "peek_delay": args.peek_delay,
            "worker_ready_ms": ready_s * 1000,
            "worker_trouble_lines": len(trouble),
            # The machine's 1-minute load average before and after: other work on it shows up as lateness.
            "load_avg_before": load_before,
            "load_avg_after": os.getloadavg()[0],
        }
