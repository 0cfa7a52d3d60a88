"""``python -m benchmarks costs``: what one handled message costs, counted rather than timed.

    python -m benchmarks costs [--messages N] [--batch-size B] [--records R]

PostgreSQL only.  A pump in this process drains N messages (pre-filled with
``send_many``) of one queue for each variant:

- ``noop``: a handler that does nothing, processing records on (the default);
- ``noop_no_records``: the same with ``SLUICE_PROCESSING_RECORDS`` off;
- ``relay``: a handler that writes one business row and sends one message on
  (``sends_atomic_with_receive``);
- ``relay_outbox``: the same in ``outbox`` mode (phase 1 in the receive, phase 2 after it).

Per message, for each: ``statements_per_100`` (statements the pump's connection sent per
100 messages, counted by an execute wrapper: savepoints included, BEGIN and COMMIT not:
add 2 per receive batch), ``wal_bytes`` (the server's
WAL position before and after), ``db_cpu_us`` (CPU time of the PostgreSQL backend serving
the pump's connection, from /proc: this machine runs the server) and ``worker_cpu_us``
(this process's CPU time).  Counts and CPU time, not wall time: other work on the machine
hardly moves them, so two runs on a busy machine still compare.  The WAL position is the
server's, though: other sessions' writes (and a checkpoint's full-page images) count too,
so run it while no other database work runs on that server.

``--records R`` first fills the processing records' table with R records (ids made as
``send`` makes them, ended over the last hour) and takes a checkpoint before each variant,
as a worker meets a table holding the retention's records, some minutes after the last
checkpoint: what a record costs depends on how its index keys fall among those already
there.  The checkpoint needs the ``pg_checkpoint`` role (or a superuser); without it the
run says so and goes on.
"""
from __future__ import annotations

import argparse
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

from benchmarks.common import (BenchmarkError, bench_database, log, non_negative_int, positive_int, setup_django,
                               standard_main)

HELP = "per-message cost of handling (statements, WAL bytes, database and worker CPU), by variant"
QUEUE = "costs"
ONWARD = "costs_out"
DATABASE_NAME = "sluice_bench_costs"
VARIANTS = ("noop", "noop_no_records", "relay", "relay_outbox")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=positive_int, default=5000, metavar="N",
                        help="messages per variant (default 5000)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="receive batch size (default: SLUICE_RECEIVE_BATCH_SIZE's)")
    parser.add_argument("--records", type=non_negative_int, default=0, metavar="R",
                        help="processing records in the table before the variants run (default 0)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("costs", HELP, add_arguments, run, argv)


class StatementCounter:
    """An execute wrapper counting the statements a connection sends."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process on this machine (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def counted(variant: str, n: int) -> Iterator[dict[str, Any]]:
    """Statements, WAL bytes and CPU of the block, per message, into the yielded dict."""
    from django.db import connection

    result: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), pg_current_wal_insert_lsn()")
        pid, wal_before = cursor.fetchone()
    counter = StatementCounter()
    db_before, cpu_before = backend_cpu_s(pid), time.process_time()
    with connection.execute_wrapper(counter):
        yield result
    db_after, cpu_after = backend_cpu_s(pid), time.process_time()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [wal_before])
        (wal,) = cursor.fetchone()
    result.update({
        "statements_per_100": round((counter.count - 1) / n * 100, 1),  # less the WAL read after
        "wal_bytes": round(float(wal) / n),
        "db_cpu_us": round((db_after - db_before) / n * 1e6, 1),
        "worker_cpu_us": round((cpu_after - cpu_before) / n * 1e6, 1),
    })
    log(f"{variant}: {result}")


def registry() -> Any:
    from core.demo.models import PingRecord
    from core.handlers import HandlerRegistry

    handlers = HandlerRegistry()
    handlers.register(QUEUE, "Noop", lambda message, context: None)

    def relay(message, context) -> None:
        PingRecord.objects.using(context.using).create(message_id=message.id)
        context.send(ONWARD, {"from": message.id}, message_type="Relayed")

    handlers.register(QUEUE, "Relay", relay)
    return handlers


def fill_records(count: int) -> None:
    """``count`` processing records, in chunks of 10,000, with message and conversation ids
    made the way send() makes them."""
    from core.outgoing import new_ids
    from core.records.writer import insert_rows, now_us

    start = now_us() - 3600 * 1_000_000
    step = max(1, 3600 * 1_000_000 // max(count, 1))
    for first in range(0, count, 10_000):
        size = min(10_000, count - first)
        ids = new_ids(2 * size)
        rows = []
        for i in range(size):
            ended = start + (first + i) * step
            rows.append((ids[2 * i], "Noop", QUEUE, QUEUE, ended - 900, ended - 400, ended, "processed", 1, None,
                         ids[2 * i + 1], None, ids[2 * i], "send", QUEUE, "bench-host", "bench-host:1", None))
        insert_rows(rows, "default")
        if first % 200_000 == 0:
            log(f"records: {first + size:,} of {count:,}")


def checkpoint() -> None:
    """A checkpoint, so that every variant starts as a worker does after one (best effort)."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError as exc:
        log(f"no checkpoint ({str(exc).strip()}): WAL figures depend on when the server took its last one")


def drain(variant: str, n: int, batch_size: int | None, handlers: Any) -> dict[str, Any]:
    from django.test import override_settings

    from core.receive.pump import MessagePump
    from core.transport import Transport

    transport = Transport()
    kind = "Relay" if variant.startswith("relay") else "Noop"
    for first in range(0, n, 1000):
        transport.send_many(QUEUE, [{"i": i} for i in range(first, min(first + 1000, n))], message_type=kind)
    mode = "outbox" if variant == "relay_outbox" else "sends_atomic_with_receive"
    options = {"SLUICE_PROCESSING_RECORDS": variant != "noop_no_records", "SLUICE_TRANSACTION_MODE": mode}
    with override_settings(**options):
        pump = MessagePump(QUEUE, transaction_mode=mode, handlers=handlers, receive_batch_size=batch_size,
                           concurrency=1, delayed_retries=0)
        try:
            with counted(variant, n) as result:
                deadline = time.monotonic() + 600
                while transport.counts(QUEUE).total:
                    pump.step()
                    if time.monotonic() > deadline:
                        raise BenchmarkError(f"{variant}: the queue did not drain in 600 s")
        finally:
            pump.close()
    left = transport.counts("error").total
    if left:
        raise BenchmarkError(f"{variant}: {left} message(s) went to the error queue")
    if kind == "Relay" and transport.counts(ONWARD).total < n:
        raise BenchmarkError(f"{variant}: only {transport.counts(ONWARD).total} of {n} onward messages")
    transport.purge(ONWARD)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_database("postgresql", name=DATABASE_NAME) as url:
        setup_django(url)
        from core.outbox import create_outbox_table
        from core.queues import create_queue

        create_queue(QUEUE)
        create_queue(ONWARD)
        create_outbox_table()
        handlers = registry()
        fill_records(args.records)
        drain("noop", min(args.messages, 500), args.batch_size, handlers)  # warm: caches, prepared statements
        result: dict[str, Any] = {"benchmark": "costs", "messages": args.messages, "db": "postgresql"}
        if args.records:
            result["records"] = args.records
        for variant in VARIANTS:
            if args.records:
                checkpoint()
            for key, value in drain(variant, args.messages, args.batch_size, handlers).items():
                result[f"{variant}_{key}"] = value
    return result
