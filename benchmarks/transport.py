"""Transport throughput: send, drain with one worker, and both at once (end to end).

    python -m benchmarks transport --db sqlite|postgresql [--messages N] [--concurrency C] [--batch-size B]

1. *send*: N ``Ping`` messages to ``demo``, one autocommitted INSERT each → ``send_per_s``.
2. *drain*: one ``sluice worker --queue demo --until-empty --concurrency C`` process
   takes them all, timed from its start until it exits.  Its own start-up, until-empty
   check and shut-down are measured by runs on the empty queue first (one untimed
   warm-up, then the median of three) and subtracted:
   ``receive_per_s = N / (drain − empty run)``.  ``receive_after_ready_per_s`` does the
   same from the worker's "worker serving" line on, leaving out the noisy Python/Django
   start-up.  Afterwards ``sluice_demo_ping`` must hold exactly N rows with N distinct
   message ids, and the ``demo`` and ``error`` queues must be empty.
3. *end to end*: a worker (no --until-empty) is started and waited for; then N more
   Pings are sent and ``sluice_demo_ping`` is polled until it holds 2N rows:
   ``e2e_per_s = N / (time of 2N rows − time of the first send)``.  An idle worker
   peeks every ``SLUICE_PEEK_DELAY`` seconds (1 s by default), so for small N this
   number is dominated by that delay, not by throughput.

``--batch-size`` sets ``SLUICE_RECEIVE_BATCH_SIZE`` and ``--peek-delay``
``SLUICE_PEEK_DELAY`` for the worker (default: leave the setting alone).
"""
from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Any

from benchmarks.common import (
    BenchmarkError, Progress, Worker, add_database_argument, bench_database, database_version, emit_result,
    log, positive_int, rate, run_main, setup_django, worker_env,
)

HELP = "send, drain with one worker and end-to-end throughput of one queue"
QUEUE = "demo"
MESSAGE_TYPE = "Ping"
POLL_INTERVAL = 0.01
#: Empty runs timed (after one untimed warm-up run); their median is subtracted.
EMPTY_RUNS = 3
STATS_RE = re.compile(r"(received|handled|retried|to error|expired|poison) (\d+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=2000, metavar="N",
                        help="messages per phase (default 2000)")
    parser.add_argument("--concurrency", type=positive_int, default=4, metavar="C",
                        help="the worker's --concurrency (default 4)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="SLUICE_RECEIVE_BATCH_SIZE for the worker (default: leave the setting alone)")
    parser.add_argument("--peek-delay", type=float, default=None, metavar="S",
                        help="SLUICE_PEEK_DELAY for the worker (default: leave the setting alone); "
                             "an idle worker looks at the queue every S seconds, which bounds e2e latency")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up on a phase after S seconds (default: 60 + N/20)")


def main(argv: list[str] | None = None) -> int:
    def body(argv):
        parser = argparse.ArgumentParser(prog="python -m benchmarks transport", description=HELP)
        add_arguments(parser)
        emit_result(run(parser.parse_args(argv)))

    return run_main(body, argv)


# -- helpers on the bench database (this process) ---------------------------------------------
def ping_counts() -> tuple[int, int]:
    """(rows, distinct message ids) of the demo handler's business table."""
    from django.db.models import Count

    from core.demo.models import PingRecord

    totals = PingRecord.objects.aggregate(rows=Count("id"), distinct=Count("message_id", distinct=True))
    return totals["rows"], totals["distinct"]


def ping_rows() -> int:
    from core.demo.models import PingRecord

    return PingRecord.objects.count()


def queue_total(name: str) -> int:
    from core.transport import Transport

    return Transport().counts(name).total


def check_pings(expected: int, phase: str) -> int:
    """Exactly ``expected`` rows with as many distinct message ids, or BenchmarkError.
    Returns the number of duplicates (always 0 when it returns)."""
    rows, distinct = ping_counts()
    duplicates = rows - distinct
    if rows != expected or distinct != expected:
        raise BenchmarkError(
            f"{phase}: sluice_demo_ping has {rows} rows and {distinct} distinct message ids; "
            f"expected {expected} of each ({duplicates} duplicate(s), {expected - distinct} lost)")
    return duplicates


def check_queues(phase: str) -> None:
    left, errors = queue_total(QUEUE), queue_total("error")
    if left or errors:
        raise BenchmarkError(f"{phase}: {left} message(s) left on {QUEUE!r}, {errors} on 'error'")


def send_pings(count: int, start: int, label: str) -> tuple[float, float]:
    """Send ``count`` Pings one INSERT each; returns (time of first send, seconds taken)."""
    from core.transport import Transport

    transport = Transport()
    progress = Progress(label, count)
    first = time.perf_counter()
    for i in range(count):
        transport.send(QUEUE, {"n": start + i}, message_type=MESSAGE_TYPE)
        progress.update(i + 1)
    elapsed = time.perf_counter() - first
    progress.done(f"{rate(count, elapsed) or 0:.0f} msg/s")
    return first, elapsed


def parse_stats(line: str | None) -> dict[str, int] | None:
    if not line:
        return None
    return {key.replace(" ", "_"): int(value) for key, value in STATS_RE.findall(line)}


# -- the benchmark --------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    n, c = args.messages, args.concurrency
    timeout = args.timeout or 60 + n / 20
    with bench_database(args.db) as url:
        setup_django(url)
        version = database_version()
        extra_env = {}
        if args.batch_size:
            extra_env["SLUICE_RECEIVE_BATCH_SIZE"] = str(args.batch_size)
        if args.peek_delay is not None:
            extra_env["SLUICE_PEEK_DELAY"] = repr(args.peek_delay)
        env = worker_env(url, extra_env)
        worker_args = ["--queue", QUEUE, "--concurrency", str(c)]
        trouble: list[str] = []

        # 0. the worker's own start-up and shut-down, on the empty queue: one warm-up run
        #    (cold imports, .pyc files), then the median of EMPTY_RUNS.
        empty_runs: list[float] = []
        empty_after_ready: list[float] = []
        for i in range(EMPTY_RUNS + 1):
            with Worker([*worker_args, "--until-empty"], env, "empty-run worker") as worker:
                total = worker.wait(timeout)
                trouble += worker.trouble()
            label = "warm-up" if i == 0 else f"{i}/{EMPTY_RUNS}"
            log(f"empty run {label}: {total:.2f} s (start-up + until-empty check + shut-down)")
            if i:
                empty_runs.append(total)
                empty_after_ready.append(worker.serving_seconds())
        empty_s = statistics.median(empty_runs)
        empty_after_ready_s = None if None in empty_after_ready else statistics.median(empty_after_ready)

        # 1. send
        _, send_s = send_pings(n, 0, "send")

        # 2. drain with one worker
        log(f"drain: worker --until-empty --concurrency {c}"
            + (f" (SLUICE_RECEIVE_BATCH_SIZE={args.batch_size})" if args.batch_size else ""))
        with Worker([*worker_args, "--until-empty"], env, "drain worker") as worker:
            drain_s = worker.wait(timeout)
            trouble += worker.trouble()
            drain_stats = parse_stats(worker.stats_line())
            drain_after_ready_s = worker.serving_seconds()
        receive_s = drain_s - empty_s
        # The same, ignoring the (noisy) Python/Django start-up before "worker serving".
        receive_after_ready_s = (None if drain_after_ready_s is None or empty_after_ready_s is None
                                 else drain_after_ready_s - empty_after_ready_s)
        log(f"drain: {drain_s:.2f} s; minus empty run = {receive_s:.2f} s; worker says: {drain_stats}")
        if receive_s <= 0:
            log("warning: the drain took no longer than the empty run; use more --messages")
        duplicates = check_pings(n, "drain")
        check_queues("drain")

        # 3. end to end: a serving worker, then send
        log("end to end: starting the worker")
        with Worker(worker_args, env, "e2e worker") as worker:
            ready_s = worker.wait_ready(timeout)
            log(f"end to end: worker serving after {ready_s:.2f} s; sending")
            first_send, e2e_send_s = send_pings(n, n, "e2e send")
            progress = Progress("e2e handled", n)
            deadline = time.perf_counter() + timeout
            while True:
                rows = ping_rows()
                progress.update(rows - n)
                if rows >= 2 * n:
                    reached = time.perf_counter()
                    break
                if not worker.alive():
                    raise BenchmarkError(f"e2e worker died with {rows - n}/{n} handled:\n{worker.tail()}")
                if time.perf_counter() > deadline:
                    raise BenchmarkError(f"end to end: only {rows - n}/{n} handled after {timeout:g} s:\n"
                                         f"{worker.tail()}")
                time.sleep(POLL_INTERVAL)
            e2e_s = reached - first_send
            progress.done(f"{rate(n, e2e_s) or 0:.0f} msg/s end to end")
            stop_s = worker.terminate()
            trouble += worker.trouble()
            e2e_stats = parse_stats(worker.stats_line())
        log(f"end to end: worker stopped {stop_s:.2f} s after SIGTERM; worker says: {e2e_stats}")
        duplicates += check_pings(2 * n, "end to end")
        check_queues("end to end")

        if trouble:
            log(f"{len(trouble)} worker stderr line(s) looked like trouble (shown above)")
        return {
            "benchmark": "transport",
            "db": args.db,
            "db_version": version,
            "messages": n,
            "concurrency": c,
            "batch_size": args.batch_size,
            "peek_delay": args.peek_delay,
            "send_per_s": rate(n, send_s),
            "receive_per_s": rate(n, receive_s),
            "receive_after_ready_per_s": None if receive_after_ready_s is None else rate(n, receive_after_ready_s),
            "e2e_per_s": rate(n, e2e_s),
            "duplicates": duplicates,
            "send_ms": send_s * 1000,
            "drain_ms": drain_s * 1000,
            "worker_empty_run_ms": empty_s * 1000,
            "worker_empty_runs_ms": [t * 1000 for t in empty_runs],
            "worker_ready_ms": ready_s * 1000,
            "e2e_ms": e2e_s * 1000,
            "e2e_send_ms": e2e_send_s * 1000,
            "drain_worker": drain_stats,
            "e2e_worker": e2e_stats,
            "worker_trouble_lines": len(trouble),
        }
