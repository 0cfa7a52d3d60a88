"""`sluice records export` speed: N processing records in the database → Parquet.

    python -m benchmarks export --db sqlite|postgresql [--records N]

Inserts N records (default 1,000,000; multi-row INSERTs as the pump writes them, not
timed), then times one export run into a temporary directory and checks the data set
holds exactly N rows with every id once.  Final JSON line: ``records``, ``seconds``,
``export_per_s``, ``bytes``, ``files``, ``database``.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    BenchmarkError, Progress, add_database_argument, bench_database, log, positive_int, rate,
    standard_main, setup_django,
)

HELP = "export of N processing records from the database to the Parquet data set"
INSERT_CHUNK = 5000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--records", type=positive_int, default=1_000_000, metavar="N",
                        help="records to export (default 1,000,000)")


def fill(records: int) -> None:
    from django.db import transaction

    from core.records.writer import insert_rows, now_us

    base = now_us() - 3_600_000_000
    outcomes = ("processed",) * 17 + ("retried", "failed", "expired")
    progress = Progress("insert", records)
    for start in range(0, records, INSERT_CHUNK):
        rows = []
        for i in range(start, min(records, start + INSERT_CHUNK)):
            ended = base + i * 3
            rows.append((f"5f0c1a52-{i:08d}", ("Ping", "Order", "Invoice")[i % 3], ("demo", "orders")[i % 2],
                         "bench", ended - 900, ended - 400, ended, outcomes[i % 20], 1, None))
        with transaction.atomic():
            insert_rows(rows, "default")
        progress.update(min(records, start + INSERT_CHUNK))
    progress.done()


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_database(args.db, name="sluice_bench_export") as url:
        setup_django(url)
        import pyarrow.dataset as ds

        from core.records.export import export_records

        fill(args.records)
        directory = Path(tempfile.mkdtemp(prefix="sluice-bench-export-"))
        try:
            started = time.perf_counter()
            result = export_records(str(directory), delay=0)
            seconds = time.perf_counter() - started
            table = ds.dataset(directory, format="parquet", partitioning="hive").to_table(columns=["id"])
            if result.exported != args.records or table.num_rows != args.records or \
                    len(set(table["id"].to_pylist())) != args.records:
                raise BenchmarkError(f"exported {result.exported}, data set has {table.num_rows} rows; "
                                     f"expected {args.records} distinct")
            size = sum(f.stat().st_size for f in directory.rglob("*.parquet"))
            log(f"export: {args.records} records in {seconds:.2f} s, {size / 1e6:.1f} MB in {len(result.files)} file(s)")
            return {"records": args.records, "seconds": seconds, "export_per_s": rate(args.records, seconds),
                    "bytes": size, "files": len(result.files), "database": args.db}
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return standard_main("export", HELP, add_arguments, run, argv)
