"""Transport throughput and latency of one queue with one worker process.

    python -m benchmarks transport --db sqlite|postgresql [--messages N] [--handler noop|orm|batch]
        [--concurrency C] [--batch-size B] [--peek-delay S]

Every handled message is recorded by the worker itself (benchmarks/handlers.py: its
handler start and its commit, wall clock), so nothing polls the database while a
phase is timed; counts and duplicates are checked from the records and the business
table afterwards.  Queue ``bench``; the producer is a process of its own
(benchmarks/producer.py).

1. *send*: ``min(N, 1000)`` single sends, one autocommitted INSERT each → ``send_per_s``.
2. *send_many*: N messages in batches of 1,000 (``Transport.send_many`` in one
   transaction per batch) → ``send_many_per_s``.  This pre-fills the queue.
3. *drain*: one ``sluice worker --until-empty`` process takes everything; from its
   records, messages ÷ (first handler start → last commit) → ``drain_per_s``
   (``receive_per_s`` and ``receive_after_ready_per_s``, the older keys, now carry the
   same figure).
3b. *traced drains* (unless ``--no-otel``): the queue filled again with as many messages,
   sent with tracing on (they carry ``traceparent``), and drained by a worker with
   ``SLUICE_OTEL=1``: the SDK, its batch span processor and the OTLP/HTTP exporter
   sending to a receiver thread on 127.0.0.1 that accepts and discards
   (benchmarks/otlp_sink.py) → ``drain_otel_per_s``, ``otel_overhead_pct`` = drain
   throughput lost against a control drain (``drain_control_per_s``: the same refill, tracing
   off; negative: noise in its favour), ``otel_spans_exported``; then again with 10 % of
   traces sampled (``otel_sampled_*``) and with 1 % (``otel_sampled_1pct_*``).  Three
   rounds of these four drains (``--otel-repeats``; one below 1,000 messages), each traced
   drain compared with its round's control: the keys are the medians (``otel_repeats``).
4. *end to end*: a worker serving and idle (one probe message handled); the producer
   sends N in batches of 100 as fast as it can → ``e2e_per_s`` = N ÷ (first send → last
   commit), ``latency_ms_p50/p99`` = commit in the worker − the send call.
   ``e2e_producer_ms`` is the producer's own span (first send → last commit) and
   ``e2e_first_start_ms`` first send → first handler start; ``drain_messages_per_call``
   / ``e2e_messages_per_call`` are messages per handler call (1 for a per-message
   handler; a batch handler's chunk size), to tell a small-chunk e2e from a starved one.
5. *idle pick-up*: the same worker idle; the producer sends 200 single messages 20 ms
   apart → ``idle_pickup_ms_p50/p99`` = handler start − the send's commit.

``--handler orm`` writes one business row per message through the ORM
(``sluice_demo_ping``); ``--handler batch`` the same rows from a batch handler
(``@handler(..., batch=True)``), one ``bulk_create`` per call; every row must be there
exactly once at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO_ROOT, BenchmarkError, Progress, Worker, add_database_argument, bench_database, database_version,
    log, positive_int, rate, standard_main, setup_django, worker_env,
)
from benchmarks.otlp_sink import OtlpSink
from benchmarks.records import BATCH, NOOP, ORM, QUEUE, read_records

HELP = "send, send_many, drain, end-to-end, latency and idle pick-up of one queue with one worker"
HANDLERS = {"noop": NOOP, "orm": ORM, "batch": BATCH}
SINGLE_SENDS = 1000
SEND_MANY_BATCH = 1000
E2E_BATCH = 100
IDLE_SENDS = 200
IDLE_GAP = 0.02
#: The share of traces the sampled traced drains keep (3b), and their keys' prefixes.
SAMPLED_RATIO = 0.1
RARE_RATIO = 0.01
#: How often the benchmark looks at the record file (a stat, not a query) while waiting.
FILE_POLL = 0.005


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=20000, metavar="N",
                        help="messages per phase (default 20000)")
    parser.add_argument("--handler", choices=tuple(HANDLERS), default="noop",
                        help="noop: record only; orm: one business row per message through the ORM; "
                             "batch: a batch handler, one bulk_create of business rows per call")
    parser.add_argument("--concurrency", type=positive_int, default=None, metavar="C",
                        help="the worker's --concurrency (default: SLUICE_CONCURRENCY)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="SLUICE_RECEIVE_BATCH_SIZE for the worker (default: leave the setting alone)")
    parser.add_argument("--peek-delay", type=float, default=None, metavar="S",
                        help="SLUICE_PEEK_DELAY for the worker (default: leave the setting alone)")
    parser.add_argument("--no-otel", dest="otel", action="store_false",
                        help="skip the traced drain (otel_overhead_pct is then null)")
    parser.add_argument("--otel-repeats", type=positive_int, default=None, metavar="R",
                        help="rounds of the traced drains, reported as medians (default 3; 1 below 1000 messages)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up on a phase after S seconds (default: 60 + N/20)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("transport", HELP, add_arguments, run, argv)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def wait_for_records(path: str, count: int, worker: Worker, timeout: float, label: str) -> list[tuple]:
    """Wait until the record file holds ``count`` lines (each line is fixed-format and
    written whole), reading only the file; the records."""
    progress = Progress(label, count)
    deadline = time.perf_counter() + timeout
    lines = 0
    while True:
        try:
            with open(path, "rb") as f:
                lines = f.read().count(b"\n")
        except FileNotFoundError:
            lines = 0
        progress.update(lines)
        if lines >= count:
            break
        if not worker.alive():
            raise BenchmarkError(f"{label}: worker died with {lines}/{count} handled:\n{worker.tail()}")
        if time.perf_counter() > deadline:
            raise BenchmarkError(f"{label}: only {lines}/{count} handled after {timeout:g} s:\n{worker.tail()}")
        time.sleep(FILE_POLL)
    progress.done()
    return read_records(path)


def check_once(records: list[tuple], expected: range, phase: str) -> None:
    seen = [r[0] for r in records]
    missing = set(expected) - set(seen)
    if len(seen) != len(set(seen)) or missing or len(seen) != len(expected):
        raise BenchmarkError(f"{phase}: {len(seen)} records, {len(set(seen))} distinct, {len(missing)} missing; "
                             f"expected {len(expected)} exactly once")


def produce(env: dict[str, str], mode: str, message_type: str, start: int, count: int, timeout: float,
            **options: Any) -> dict[str, Any]:
    """Run the producer process; its JSON line."""
    argv = [sys.executable, "-m", "benchmarks.producer", mode, "--type", message_type, "--queue", QUEUE,
            "--start", str(start), "--messages", str(count)]
    for key, value in options.items():
        argv += [f"--{key}", str(value)]
    result = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise BenchmarkError(f"producer ({mode}) failed with {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def send_phases(n: int, message_type: str) -> tuple[float, float, int]:
    """Single sends, then send_many batches (in this process); (send/s, send_many/s, total)."""
    from django.db import transaction

    from core.transport import Transport

    transport = Transport()
    singles = min(n, SINGLE_SENDS)
    started = time.perf_counter()
    for i in range(singles):
        transport.send(QUEUE, {"i": i}, message_type=message_type)
    send_s = time.perf_counter() - started
    log(f"send: {singles} single sends, {rate(singles, send_s) or 0:.0f} msg/s")
    progress = Progress("send_many", n)
    started = time.perf_counter()
    for first in range(singles, singles + n, SEND_MANY_BATCH):
        bodies = [{"i": i} for i in range(first, min(first + SEND_MANY_BATCH, singles + n))]
        with transaction.atomic():
            transport.send_many(QUEUE, bodies, message_type=message_type)
        progress.update(first + len(bodies) - singles)
    many_s = time.perf_counter() - started
    progress.done(f"{rate(n, many_s) or 0:.0f} msg/s")
    return rate(singles, send_s), rate(n, many_s), singles + n


def check_business_rows(expected: int) -> None:
    from django.db.models import Count

    from core.demo.models import PingRecord

    totals = PingRecord.objects.aggregate(rows=Count("id"), distinct=Count("message_id", distinct=True))
    if totals["rows"] != expected or totals["distinct"] != expected:
        raise BenchmarkError(f"business table: {totals['rows']} rows, {totals['distinct']} distinct message ids; "
                             f"expected {expected} of each")


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    timeout = args.timeout or 60 + n / 20
    message_type = HANDLERS[args.handler]
    os.environ["SLUICE_HANDLER_MODULES"] = "benchmarks.handlers"
    workdir = Path(tempfile.mkdtemp(prefix="sluice-bench-records-"))
    with bench_database(args.db) as url:
        setup_django(url)
        from core.conf import get_settings

        settings = get_settings()
        version = database_version()
        extra_env = {"SLUICE_HANDLER_MODULES": "benchmarks.handlers", "SLUICE_LOG_LEVEL": "WARNING"}
        if args.batch_size:
            extra_env["SLUICE_RECEIVE_BATCH_SIZE"] = str(args.batch_size)
        if args.peek_delay is not None:
            extra_env["SLUICE_PEEK_DELAY"] = repr(args.peek_delay)
        concurrency = args.concurrency or settings.CONCURRENCY
        worker_args = ["--queue", QUEUE, "--concurrency", str(concurrency)]
        trouble: list[str] = []

        # 1–2. sends into the idle queue (no worker yet)
        send_per_s, send_many_per_s, filled = send_phases(n, message_type)

        # 3. drain
        reclaim_dead_rows()
        drain_file = str(workdir / "drain")
        log(f"drain: worker --until-empty --concurrency {concurrency}")
        with Worker([*worker_args, "--until-empty"], worker_env(url, {**extra_env, "BENCH_RECORD_FILE": drain_file}),
                    "drain worker") as worker:
            worker.wait(timeout)
            trouble += worker.trouble()
        drained = read_records(drain_file)
        check_once(drained, range(filled), "drain")
        drain_s = (max(r[2] for r in drained) - min(r[1] for r in drained)) / 1e9
        drain_per_s = rate(filled, drain_s)
        log(f"drain: {filled} in {drain_s:.2f} s = {drain_per_s or 0:.0f} msg/s (worker's own timestamps)")

        # 3b. the same drain with tracing on, exported over OTLP/HTTP to a local receiver: every
        # message sampled, then a tenth (the parent-based ratio sampler busy endpoints run),
        # each against a control: an untraced drain of a table refilled the same way.
        # Each round drains a control and the three traced refills one after the other, and
        # each traced figure is compared with its own round's control; the keys hold the
        # medians of the rounds (this machine's speed drifts within a minute).
        traced: dict[str, Any] = {}
        refilled = 0
        repeats = otel_repeats(args)
        if args.otel:
            rounds: dict[str, list[float]] = {}
            for _ in range(repeats):
                control = traced_drain(url, worker_args, extra_env, workdir, message_type, filled + refilled, filled,
                                       timeout, None, trouble, None, otel=False)["drain_otel_per_s"]
                rounds.setdefault("drain_control_per_s", []).append(control)
                refilled += filled
                for ratio, key in ((None, "otel"), (SAMPLED_RATIO, "otel_sampled"), (RARE_RATIO, "otel_sampled_1pct")):
                    found = traced_drain(url, worker_args, extra_env, workdir, message_type, filled + refilled,
                                         filled, timeout, control, trouble, ratio)
                    for name, value in found.items():
                        rounds.setdefault(name.replace("otel", key, 1), []).append(value)
                    refilled += filled
            traced = {name: median(values) for name, values in rounds.items()}

        # 4–5. end to end and idle pick-up with one serving worker
        e2e_file = str(workdir / "e2e")
        env = worker_env(url, {**extra_env, "BENCH_RECORD_FILE": e2e_file})
        with Worker(worker_args, env, "e2e worker") as worker:
            worker.wait_ready(timeout)
            probe = 10 ** 9  # one message handled: the worker is warm, then idle
            produce(env, "spaced", message_type, probe, 1, timeout, gap=0)
            wait_for_records(e2e_file, 1, worker, timeout, "probe")
            time.sleep(0.5)
            base = filled + refilled
            sent = produce(env, "batches", message_type, base, n, timeout, batch=E2E_BATCH)
            records = [r for r in wait_for_records(e2e_file, n + 1, worker, timeout, "e2e handled") if r[0] != probe]
            check_once(records, range(base, base + n), "end to end")
            e2e_s = (max(r[2] for r in records) - sent["first_send_ns"]) / 1e9
            latencies = [(r[2] - r[3]) / 1e6 for r in records]
            log(f"end to end: {n} in {e2e_s:.2f} s = {rate(n, e2e_s) or 0:.0f} msg/s")

            time.sleep(0.5)
            idle_base = base + n
            spaced = produce(env, "spaced", message_type, idle_base, IDLE_SENDS, timeout, gap=IDLE_GAP)
            all_records = wait_for_records(e2e_file, n + 1 + IDLE_SENDS, worker, timeout, "idle pick-up")
            idle = {r[0]: r for r in all_records if idle_base <= r[0] < idle_base + IDLE_SENDS}
            check_once(list(idle.values()), range(idle_base, idle_base + IDLE_SENDS), "idle pick-up")
            pickups = [(idle[idle_base + k][1] - commit) / 1e6 for k, commit in enumerate(spaced["commits_ns"])]
            worker.terminate()
            trouble += worker.trouble()

        total = filled + refilled + n + 1 + IDLE_SENDS
        if message_type in (ORM, BATCH):
            check_business_rows(total)
        if trouble:
            log(f"{len(trouble)} worker stderr line(s) looked like trouble (shown above)")
        return {
            "benchmark": "transport",
            "db": args.db,
            "db_version": version,
            "messages": n,
            "handler": args.handler,
            "concurrency": concurrency,
            "batch_size": args.batch_size or settings.RECEIVE_BATCH_SIZE,
            "peek_delay": args.peek_delay if args.peek_delay is not None else settings.PEEK_DELAY,
            "send_per_s": send_per_s,
            "send_many_per_s": send_many_per_s,
            "drain_per_s": drain_per_s,
            "receive_per_s": drain_per_s,
            "receive_after_ready_per_s": drain_per_s,
            "e2e_per_s": rate(n, e2e_s),
            "latency_ms_p50": percentile(latencies, 50),
            "latency_ms_p99": percentile(latencies, 99),
            "idle_pickup_ms_p50": percentile(pickups, 50),
            "idle_pickup_ms_p99": percentile(pickups, 99),
            "idle_pickup_ms_max": max(pickups),
            "duplicates": 0,  # check_once refused any
            "drain_ms": drain_s * 1000,
            "drained": filled,
            "e2e_ms": e2e_s * 1000,
            "worker_trouble_lines": len(trouble),
            # Where e2e goes: the producer's own span, and messages per handler call (one
            # start time per call; 1.0 for per-message handlers) in each phase.
            "e2e_producer_ms": (sent["last_commit_ns"] - sent["first_send_ns"]) / 1e6,
            "e2e_first_start_ms": (min(r[1] for r in records) - sent["first_send_ns"]) / 1e6,
            "drain_messages_per_call": messages_per_call(drained),
            "e2e_messages_per_call": messages_per_call(records),
            # The traced drain (3b): null with --no-otel.
            "drain_otel_per_s": traced.get("drain_otel_per_s"),
            "otel_overhead_pct": traced.get("otel_overhead_pct"),
            "otel_spans_exported": traced.get("otel_spans_exported"),
            "drain_otel_sampled_per_s": traced.get("drain_otel_sampled_per_s"),
            "otel_sampled_overhead_pct": traced.get("otel_sampled_overhead_pct"),
            "otel_sampled_spans_exported": traced.get("otel_sampled_spans_exported"),
            "otel_sampled_ratio": SAMPLED_RATIO if args.otel else None,
            "drain_otel_sampled_1pct_per_s": traced.get("drain_otel_sampled_1pct_per_s"),
            "otel_sampled_1pct_overhead_pct": traced.get("otel_sampled_1pct_overhead_pct"),
            "otel_sampled_1pct_spans_exported": traced.get("otel_sampled_1pct_spans_exported"),
            "drain_control_per_s": traced.get("drain_control_per_s"),
            "otel_repeats": repeats if args.otel else None,
        }


def otel_repeats(args: argparse.Namespace) -> int:
    """Rounds of traced drains: ``--otel-repeats``, else 3 for a real run and 1 for a
    small one (a test's: each drain there is mostly a worker's start-up)."""
    if args.otel_repeats is not None:
        return args.otel_repeats
    return 3 if args.messages >= 1000 else 1


def median(values: list[float | None]) -> float | None:
    found = sorted(value for value in values if value is not None)
    if not found:
        return None
    middle = len(found) // 2
    return found[middle] if len(found) % 2 else round((found[middle - 1] + found[middle]) / 2, 1)


def traced_drain(url: str, worker_args: list[str], extra_env: dict[str, str], workdir: Path, message_type: str,
                 start: int, count: int, timeout: float, drain_per_s: float | None, trouble: list[str],
                 ratio: float | None, otel: bool = True) -> dict[str, Any]:
    """Phase 3b (module doc): refill with traced sends, drain with SLUICE_OTEL=1; every
    message sampled (``ratio`` None), or that share of traces by producer and worker.
    ``otel`` False: the control, the same refill and drain with tracing off."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    end = start + count
    refill_traced(start, count, message_type, ratio)
    reclaim_dead_rows()  # the drain before left dead rows; this one starts as that one did
    drain_file = str(workdir / f"drain-otel-{ratio or 1}-{otel}-{start}")
    sampler = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": str(ratio)} if ratio else {}
    with OtlpSink(keep=True) as sink:
        env = worker_env(url, {**extra_env, "BENCH_RECORD_FILE": drain_file, "SLUICE_OTEL": "1" if otel else "0",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_SERVICE_NAME": "sluice-bench",
                               **sampler})
        log("control drain: the same refill, tracing off" if not otel else
            f"traced drain: worker --until-empty with SLUICE_OTEL=1 ({f'{ratio:.0%} of traces' if ratio else 'every message'} "
            "sampled), OTLP/HTTP to a local receiver")
        with Worker([*worker_args, "--until-empty"], env, "traced drain worker") as worker:
            worker.wait(timeout)
            trouble += worker.trouble()
        spans = sum(len(scope.spans) for body in sink.bodies("/v1/traces")
                    for resource in ExportTraceServiceRequest.FromString(body).resource_spans
                    for scope in resource.scope_spans)
    drained = read_records(drain_file)
    check_once(drained, range(start, end), "traced drain")
    drain_s = (max(r[2] for r in drained) - min(r[1] for r in drained)) / 1e9
    traced_per_s = rate(count, drain_s)
    overhead = (100 * (1 - traced_per_s / drain_per_s)) if traced_per_s and drain_per_s else None
    log(f"{'traced' if otel else 'control'} drain: {count} in {drain_s:.2f} s = {traced_per_s or 0:.0f} msg/s; {spans} spans exported; "
        f"overhead {overhead if overhead is not None else float('nan'):.1f} %")
    return {"drain_otel_per_s": traced_per_s, "otel_overhead_pct": overhead, "otel_spans_exported": spans}


def refill_traced(start: int, count: int, message_type: str, ratio: float | None) -> None:
    """Send messages ``start`` … ``start + count − 1`` traced as an instrumented producer's
    are (spans made, none exported): they carry ``traceparent``, sampled in the share
    ``ratio`` of traces (None: every one), and a worker's process spans hang from it.
    One send and one trace per message, as when each comes from a request of its own:
    no two share a ``traceparent`` or a ``TimeSent`` (a batch's shared values would
    flatter whatever a worker caches of them)."""
    from django.db import transaction
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from core import tracing
    from core.transport import Transport

    tracing.install(TracerProvider(sampler=ParentBased(TraceIdRatioBased(1.0 if ratio is None else ratio))))
    end = start + count
    try:
        transport = Transport()
        for first in range(start, end, SEND_MANY_BATCH):
            with transaction.atomic():
                for i in range(first, min(first + SEND_MANY_BATCH, end)):
                    transport.send(QUEUE, {"i": i}, message_type=message_type)
    finally:
        tracing.uninstall()


def reclaim_dead_rows() -> None:
    """Reclaim the queue table's deleted rows where the database leaves them to a
    background process (PostgreSQL with autovacuum off, as on the CI machines): each drain
    then starts from the same table, and the traced drain is compared like with like."""
    from django.db import connection

    from core.queues import dialect

    statement = dialect("default").reclaim_dead_rows(QUEUE)
    if statement is not None:
        with connection.cursor() as cursor:
            cursor.execute(*statement)


def messages_per_call(records: list) -> float:
    """Messages per handler call: a batch handler's records of one call share their start."""
    return round(len(records) / max(len({r[1] for r in records}), 1), 1)
