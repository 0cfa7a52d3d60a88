"""Does a long drain slow down as it goes?  (PostgreSQL queue-table upkeep, issue 9 item 6.)

    python -m benchmarks.long_drain [--db postgresql|sqlite] [--messages N] [--no-upkeep]

Fills one queue with N messages (default 1,000,000; ``send_many`` batches of 1,000, each
its own transaction, not timed), then drains it in this process, one receive of 100 per
transaction, as the pump does, and reports the rate of each tenth of the drain.  A queue
table whose dead rows are not vacuumed away makes every receive read further through
the dead front of the RowVersion index, so the last tenth is slower than the first;
with the per-table autovacuum settings (``Dialect.table_upkeep``) it should not be.
``--no-upkeep`` resets those settings on the table first (PostgreSQL's defaults), for
comparison.  JSON keys: ``first_10pct_per_s``, ``last_10pct_per_s``, ``last_over_first``,
``tenths_per_s``, ``dead_tuples_at_end``, ``autovacuums``.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.common import (
    BenchmarkError, Progress, add_database_argument, bench_database, database_version, log,
    positive_int, rate, standard_main, setup_django,
)

HELP = "rate of each tenth of a long drain of one queue (does it slow down as dead rows pile up?)"
QUEUE = "long_drain"
FILL_BATCH = 1000
RECEIVE_BATCH = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=1_000_000, metavar="N")
    parser.add_argument("--no-upkeep", action="store_true",
                        help="reset the table's autovacuum settings to PostgreSQL's defaults first")


def main(argv: list[str] | None = None) -> int:
    return standard_main("long_drain", HELP, add_arguments, run, argv)


def table_stats(cursor, table: str) -> tuple[int, int]:
    cursor.execute("SELECT n_dead_tup, autovacuum_count FROM pg_stat_user_tables WHERE relname = %s", [table])
    row = cursor.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    with bench_database(args.db, name="sluice_bench_long_drain") as url:
        setup_django(url)
        from django.db import connection, transaction

        from core.dialects.postgresql import TABLE_UPKEEP
        from core.queues import create_queue, dialect
        from core.transport import Transport

        create_queue(QUEUE)
        d = dialect()
        upkeep = d.supports_table_upkeep and not args.no_upkeep
        if d.supports_table_upkeep and args.no_upkeep:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {d.table(QUEUE)} RESET ({', '.join(k for k, _ in TABLE_UPKEEP)})")
        transport = Transport()
        progress = Progress("fill", n)
        for first in range(0, n, FILL_BATCH):
            with transaction.atomic():
                transport.send_many(QUEUE, [{"i": i} for i in range(first, min(first + FILL_BATCH, n))])
            progress.update(min(first + FILL_BATCH, n))
        progress.done()

        tenth = max(n // 10, 1)
        marks, got = [time.perf_counter()], 0
        progress = Progress("drain", n)
        while got < n:
            with transaction.atomic():
                batch = transport.receive_batch(QUEUE, RECEIVE_BATCH)
            if not batch:
                raise BenchmarkError(f"the queue ran dry after {got} of {n}")
            got += len(batch)
            while got >= tenth * len(marks) and len(marks) <= 10:
                marks.append(time.perf_counter())
            progress.update(got)
        progress.done()
        tenths = [rate(tenth, b - a) for a, b in zip(marks, marks[1:])]
        dead, autovacuums = (0, 0)
        if d.supports_table_upkeep:  # dead rows and autovacuum runs: the statistics of the databases that have upkeep
            with connection.cursor() as cursor:
                dead, autovacuums = table_stats(cursor, QUEUE)
        first, last = tenths[0], tenths[-1]
        log(f"drain tenths: {', '.join(f'{r:.0f}' for r in tenths)} msg/s")
        return {
            "benchmark": "long_drain",
            "db": args.db,
            "db_version": database_version(),
            "messages": n,
            "upkeep": upkeep,
            "first_10pct_per_s": first,
            "last_10pct_per_s": last,
            "last_over_first": last / first if first and last else None,
            "tenths_per_s": tenths,
            "drain_per_s": rate(n, marks[-1] - marks[0]),
            "dead_tuples_at_end": dead,
            "autovacuums": autovacuums,
        }


if __name__ == "__main__":
    raise SystemExit(main())
