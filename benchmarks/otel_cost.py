"""Tracing's CPU cost per message, measured in one process, A against B.

    python -m benchmarks otel_cost --db postgresql|sqlite [--messages N] [--rounds R] [--instructions N]

The transport benchmark's traced drains (``otel_overhead_pct``) are three-second runs of
separate worker processes: on a small machine whose speed drifts within a minute, one
such comparison moves by ±15 %.  This one asks a narrower question with far less noise:
how much CPU does one message cost the worker process with tracing on, against off?

Each round refills queue ``bench`` with N noop messages sent traced (``traceparent``),
then drains them in this process with one :class:`~core.receive.pump.MessagePump` thread —
the real receive, handler call, processing records and commit — under each variant in
turn: tracing off, every message sampled, 10 % and 1 % of traces sampled (the SDK set
up as ``SLUICE_OTEL=1`` sets it up: Sluice's tracer and meter providers, the batch span
processor, the OTLP/HTTP exporters, to a receiver in a process of its own).  The
drain's process CPU time (every thread: the export thread's encoding counts) ends after
the span processor has flushed.  The variants' order turns from round to round, and
each figure is the median over the rounds:

- ``cpu_us_per_msg_off`` / ``_every`` / ``_10pct`` / ``_1pct``: CPU µs per message;
- ``otel_cpu_us_per_msg`` / ``_10pct`` / ``_1pct``: what tracing adds, in µs, and
  ``otel_cpu_overhead_pct`` / ``_10pct`` / ``_1pct`` as a share of the untraced cost;
- ``wall_us_per_msg_off`` and friends: the same drains' wall time (one thread, so the
  database's round trips count here, which they do not in the CPU figures).

Those move with the machine's speed (±15 % from one drain to the next on a small shared
machine).  ``--instructions N`` adds a count that does not: each variant drains N more
messages in a process of its own under valgrind's callgrind (benchmarks/counted_drain.py),
counting the machine instructions the drain executes — the same to within about 1 % run
after run, whatever else the machine does: ``instructions_per_msg_off`` / ``_every`` /
``_10pct`` / ``_1pct`` and ``otel_instructions_pct`` / ``_10pct`` / ``_1pct``, what tracing
adds as a share (``instructions_messages``: N).  Under valgrind a drain runs some fifty
times slower: 3,000 messages take about a minute per variant.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import (
    REPO_ROOT, BenchmarkError, add_database_argument, bench_database, database_version, log, positive_int,
    setup_django, standard_main,
)
from benchmarks.records import NOOP, QUEUE
from benchmarks.transport import RARE_RATIO, SAMPLED_RATIO, reclaim_dead_rows, refill_traced

HELP = "tracing's CPU cost per message: one process drains traced messages with tracing off and on, in turn"
#: Variant → the share of traces sampled (None: tracing off; 1.0: every message).
VARIANTS: dict[str, float | None] = {"off": None, "every": 1.0, "10pct": SAMPLED_RATIO, "1pct": RARE_RATIO}
#: The variants compared with "off", and their keys' suffixes.
SUFFIXES = (("every", ""), ("10pct", "_10pct"), ("1pct", "_1pct"))
#: Messages a counted drain takes before it counts (connections, prepared statements).
COUNTED_WARM_UP = 50
#: Messages each variant drains once before the rounds, uncounted (at most ``--messages``).
WARM_UP = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=10000, metavar="N",
                        help="messages per drain (default 10000)")
    parser.add_argument("--rounds", type=positive_int, default=5, metavar="R",
                        help="rounds of the four drains, reported as medians (default 5)")
    parser.add_argument("--instructions", type=positive_int, default=None, metavar="N",
                        help="also count the machine instructions of a drain of N messages per variant, "
                             "under valgrind's callgrind: the same figure run after run (default: not counted)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("otel_cost", HELP, add_arguments, run, argv)


class Sink:
    """benchmarks/otlp_sink.py in a process of its own: its CPU is nobody's cost here."""

    def __enter__(self) -> str:
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.otlp_sink"], cwd=REPO_ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        endpoint = self.process.stdout.readline().strip()
        if not endpoint.startswith("http://"):
            raise BenchmarkError(f"the OTLP receiver did not start (it printed {endpoint!r})")
        return endpoint

    def __exit__(self, *exc: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(10)


def drain(ratio: float | None, count: int, warm: int = 0,
          around: tuple[Callable[[], None], Callable[[], None]] | None = None) -> tuple[float, float]:
    """Drain the queue in this process with tracing as ``ratio`` says; (CPU s, wall s) of
    the last ``count`` messages, after ``warm`` untimed ones; ``around``: called just before
    and just after the timed part (the instruction count's switch)."""
    from core import tracing
    from core.receive.pump import MessagePump
    from core.startup import settle_heap
    from core.tracing import sdk

    telemetry = None
    if ratio is not None:
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(ratio)
        provider, recorder = sdk.tracer_provider(sdk.span_exporter())
        meter_provider, histograms = sdk.sdk_meter_provider(sdk.metric_exporter())
        telemetry = tracing.install(provider, meter_provider, histograms, recorder)
    pump = MessagePump(QUEUE, concurrency=1)
    try:
        if warm:
            pump.receive_and_process(warm)
        settle_heap()  # as `sluice worker` does once it has started: a drain starts from a quiet heap
        if around is not None:
            around[0]()
        handled = 0
        cpu, wall = time.process_time(), time.perf_counter()
        while handled < count:
            got = pump.receive_and_process(pump.batch_size)
            if not got:
                raise BenchmarkError(f"the queue ran dry after {handled} of {count} messages")
            handled += got
        if telemetry is not None:
            telemetry.tracer_provider.force_flush()  # the export thread's encoding counts too
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if around is not None:
            around[1]()
    finally:
        pump.close()
        if telemetry is not None:
            tracing.uninstall()
            telemetry.tracer_provider.shutdown()
            telemetry.meter_provider.shutdown()
    return cpu, wall


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    os.environ["SLUICE_HANDLER_MODULES"] = "benchmarks.handlers"
    record_file = Path(tempfile.mkdtemp(prefix="sluice-otel-cost-")) / "records"
    os.environ["BENCH_RECORD_FILE"] = str(record_file)
    with bench_database(args.db) as url, Sink() as endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        os.environ.setdefault("OTEL_SERVICE_NAME", "sluice-bench")
        setup_django(url)
        import benchmarks.handlers  # noqa: F401 — registers the noop handler in this process

        cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
        wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        start = 0
        # A warm-up of each variant, not counted: imports, prepared statements, connections.
        warm_up = min(WARM_UP, n)
        for ratio in VARIANTS.values():
            refill_traced(start, warm_up, NOOP, ratio)
            start += warm_up
            drain(ratio, warm_up)
        for round_index in range(args.rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in order:
                ratio = VARIANTS[name]
                refill_traced(start, n, NOOP, ratio)
                start += n
                reclaim_dead_rows()
                took_cpu, took_wall = drain(ratio, n)
                cpu[name].append(took_cpu / n * 1e6)
                wall[name].append(took_wall / n * 1e6)
                log(f"round {round_index + 1}/{args.rounds} {name}: {cpu[name][-1]:.1f} µs CPU, "
                    f"{wall[name][-1]:.1f} µs wall per message")
        counted = count_instructions(args.instructions, url, start) if args.instructions else {}
        record_file.unlink(missing_ok=True)
        version = database_version()
    medians = {name: statistics.median(values) for name, values in cpu.items()}
    result: dict[str, Any] = {"benchmark": "otel_cost", "db": args.db, "db_version": version, "messages": n,
                              "rounds": args.rounds}
    for name in VARIANTS:
        result[f"cpu_us_per_msg_{name}"] = round(medians[name], 1)
        result[f"wall_us_per_msg_{name}"] = round(statistics.median(wall[name]), 1)
    for name, suffix in SUFFIXES:
        added = medians[name] - medians["off"]
        result[f"otel_cpu_us_per_msg{suffix}"] = round(added, 1)
        result[f"otel_cpu_overhead_pct{suffix}"] = round(100 * added / medians["off"], 1)
    return {**result, **counted}


def count_instructions(n: int, url: str, start: int) -> dict[str, Any]:
    """Each variant's drain of ``n`` messages in a process of its own under callgrind
    (benchmarks/counted_drain.py): instructions per message, and what tracing adds as a
    share of the untraced count."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise BenchmarkError("--instructions needs valgrind (Debian's package valgrind: apt-get install valgrind)")
    per_message: dict[str, float] = {}
    for name, ratio in VARIANTS.items():
        refill_traced(start, n + COUNTED_WARM_UP, NOOP, ratio)
        start += n + COUNTED_WARM_UP
        reclaim_dead_rows()
        result = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null",
             sys.executable, "-m", "benchmarks.counted_drain", "off" if ratio is None else str(ratio), str(n),
             str(COUNTED_WARM_UP)],
            cwd=REPO_ROOT, env={**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "sluice.settings"},
            capture_output=True, text=True, timeout=600 + n)
        found = re.search(r"Collected : (\d+)", result.stderr)
        if result.returncode != 0 or found is None:
            raise BenchmarkError(f"the counted drain ({name}) failed:\n{result.stderr[-3000:]}")
        per_message[name] = int(found.group(1)) / n
        log(f"instructions, {name}: {per_message[name]:,.0f} per message")
    counted: dict[str, Any] = {"instructions_messages": n}
    for name in VARIANTS:
        counted[f"instructions_per_msg_{name}"] = round(per_message[name])
    for name, suffix in SUFFIXES:
        counted[f"otel_instructions_pct{suffix}"] = round(100 * (per_message[name] / per_message["off"] - 1), 1)
    return counted


if __name__ == "__main__":
    sys.exit(main())
