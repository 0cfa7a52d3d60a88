"""The outbox's cost, end to end: the transport benchmark's e2e run, outbox mode on.

    python -m benchmarks outbox --db sqlite|postgresql [--messages N] [--concurrency C]

Each of the N messages is a ``Relay``: its handler writes a business row and sends one
message onward (to ``bench_out``, in the same database).  The same run is made twice,
each with a freshly started worker (``sluice worker --queue demo``, waited for before
the first send):

1. ``sends_atomic_with_receive``: the onward message is inserted in the receive
   transaction — the baseline;
2. ``outbox``: it is stored in the outbox record (phase 1) and inserted by phase 2
   after the commit.

Timed from the first send until ``bench_out`` holds N messages:
``e2e_per_s = N / that time`` (outbox mode), ``baseline_e2e_per_s`` likewise, and
``outbox_overhead_pct = (outbox time / baseline time − 1) × 100``.  Each run must end
with N business rows (N distinct ids), N onward messages, empty ``demo`` and ``error``
queues and (outbox) no undispatched record.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks import common
from benchmarks.common import (
    BenchmarkError, Progress, Worker, add_database_argument, database_version, log, positive_int,
    rate, standard_main, setup_django, worker_env,
)

HELP = "end-to-end throughput with the outbox on, and its overhead against sends_atomic_with_receive"
QUEUE = "demo"
OUT = "bench_out"
MODES = ("sends_atomic_with_receive", "outbox")
POLL_INTERVAL = 0.01
#: A database of its own, so this can run beside the transport benchmark (sluice_bench).
DATABASE_NAME = "sluice_bench_outbox"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=2000, metavar="N",
                        help="messages per run (default 2000)")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="C",
                        help="the worker's --concurrency (default 4)")
    parser.add_argument("--peek-delay", type=float, default=None, metavar="S",
                        help="SLUICE_PEEK_DELAY for the worker (default: leave the setting alone)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up on a run after S seconds (default: 60 + N/20)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("outbox", HELP, add_arguments, run, argv)


def reset() -> None:
    """Empty the queues, the business table and the outbox between runs."""
    from core.demo.models import PingRecord
    from core.outbox import Outbox
    from core.transport import Transport

    for name in (QUEUE, OUT, "error"):
        Transport().purge(name)
    PingRecord.objects.all().delete()
    Outbox().cleanup(keep_seconds=0)  # every record of the last run is dispatched


def check(n: int, mode: str) -> None:
    from django.db.models import Count

    from core.demo.models import PingRecord
    from core.outbox import Outbox
    from core.transport import Transport

    totals = PingRecord.objects.aggregate(rows=Count("id"), distinct=Count("message_id", distinct=True))
    out, left, errors = (Transport().counts(name).total for name in (OUT, QUEUE, "error"))
    undispatched = Outbox().store.stats().undispatched
    if (totals["rows"], totals["distinct"], out, left, errors, undispatched) != (n, n, n, 0, 0, 0):
        raise BenchmarkError(f"{mode}: {totals['rows']} business rows ({totals['distinct']} distinct), {out} onward "
                             f"messages, {left} left on {QUEUE}, {errors} on error, {undispatched} undispatched; "
                             f"expected {n}, {n}, {n}, 0, 0, 0")


def e2e(url: str, mode: str, args: argparse.Namespace, timeout: float) -> tuple[float, list[str]]:
    """One end-to-end run; returns (seconds from first send to N onward messages, worker trouble)."""
    from core.transport import Transport

    n = args.messages
    extra = {"SLUICE_TRANSACTION_MODE": mode}
    if args.peek_delay is not None:
        extra["SLUICE_PEEK_DELAY"] = repr(args.peek_delay)
    reset()
    transport = Transport()
    with Worker(["--queue", QUEUE, "--concurrency", str(args.concurrency)], worker_env(url, extra),
                f"{mode} worker") as worker:
        worker.wait_ready(timeout)
        progress = Progress(f"{mode} send", n)
        first = time.perf_counter()
        for i in range(n):
            transport.send(QUEUE, {"to": OUT, "n": i}, message_type="Relay")
            progress.update(i + 1)
        progress.done()
        progress = Progress(f"{mode} delivered onward", n)
        deadline = time.perf_counter() + timeout
        while (done := transport.counts(OUT).total) < n:
            progress.update(done)
            if not worker.alive():
                raise BenchmarkError(f"{mode} worker died with {done}/{n} delivered:\n{worker.tail()}")
            if time.perf_counter() > deadline:
                raise BenchmarkError(f"{mode}: only {done}/{n} delivered after {timeout:g} s:\n{worker.tail()}")
            time.sleep(POLL_INTERVAL)
        elapsed = time.perf_counter() - first
        progress.done(f"{rate(n, elapsed) or 0:.0f} msg/s end to end")
        worker.terminate()
        log(f"{mode}: worker says {worker.stats_line()}")
        trouble = worker.trouble()
    check(n, mode)
    return elapsed, trouble


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    timeout = args.timeout or 60 + n / 20
    with common.bench_database(args.db, DATABASE_NAME) as url:
        setup_django(url)
        from core.queues import create_queue

        create_queue(OUT)
        version = database_version()
        seconds: dict[str, float] = {}
        trouble: list[str] = []
        for mode in MODES:
            seconds[mode], lines = e2e(url, mode, args, timeout)
            trouble += lines
        if trouble:
            log(f"{len(trouble)} worker stderr line(s) looked like trouble (shown above)")
        baseline, outbox = seconds["sends_atomic_with_receive"], seconds["outbox"]
        return {
            "benchmark": "outbox",
            "db": args.db,
            "db_version": version,
            "messages": n,
            "concurrency": args.concurrency,
            "peek_delay": args.peek_delay,
            "e2e_per_s": rate(n, outbox),
            "baseline_e2e_per_s": rate(n, baseline),
            "outbox_overhead_pct": (outbox / baseline - 1) * 100,
            "e2e_ms": outbox * 1000,
            "baseline_e2e_ms": baseline * 1000,
            "worker_trouble_lines": len(trouble),
        }
