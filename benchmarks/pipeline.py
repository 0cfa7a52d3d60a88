"""The Spark job's speed: N generated processing records → metrics, in Spark local mode.

    python -m benchmarks pipeline [--records N] [--driver-memory 4g] [--keep DIR]

1. Generates N records (default 10,000,000) spread over one day, 4 queues × 5 message
   types, every outcome, as the exporter's Parquet data set (pipeline.schema) in a
   temporary directory — not timed.
2. Runs pipeline.job in local mode (all cores; ``--driver-memory``, default 4g, is the
   one JVM's heap) and times the job from its SparkSession on: ``seconds`` (JVM start
   included), ``job_seconds`` (without it).

Final JSON line: ``records``, ``seconds``, ``records_per_s``, ``windows``, ``job_seconds``,
``driver_memory``, ``cores``.  No database is used.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Progress, log, positive_int, rate, standard_main

HELP = "the Spark metrics job over N generated processing records (local mode)"
QUEUES = ("orders", "billing", "shipping", "email")
TYPES = ("OrderPlaced", "InvoiceDue", "ParcelSent", "MailQueued", "Ping")
DAY = dt.datetime(2026, 11, 22, tzinfo=dt.timezone.utc)
CHUNK = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=positive_int, default=10_000_000, metavar="N",
                        help="records to generate (default 10,000,000)")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (default 4g)")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="generate into DIR and keep it (default: a temporary directory, removed)")


def generate(path: Path, records: int, *, seed: int = 7, start: dt.datetime = DAY, span_s: int = 86_400) -> None:
    """``records`` processing records over ``span_s`` seconds from ``start``, written as
    the exporter's data set under ``path`` (one file per chunk and date)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipeline import schema
    from pipeline.arrow_schema import RECORD_SCHEMA, TIMESTAMP

    rng = np.random.default_rng(seed)
    outcomes = np.array(schema.OUTCOMES, dtype=object)
    weights = np.array([0.90, 0.01, 0.05, 0.02, 0.01, 0.01])
    base = int(start.timestamp() * 1_000_000)
    progress = Progress("generate", records)
    done = 0
    while done < records:
        n = min(CHUNK, records - done)
        ids = np.arange(done + 1, done + n + 1, dtype=np.int64)
        ended = base + np.sort(rng.integers(0, span_s * 1_000_000, n))
        processing = rng.lognormal(mean=8.0, sigma=1.0, size=n).astype(np.int64)  # µs, median ≈ 3 ms
        queueing = rng.exponential(200_000, n).astype(np.int64)
        started = ended - processing
        table = pa.table({
            "id": ids,
            "message_id": pa.array(ids.astype(str).astype(object)),
            "message_type": pa.array(np.array(TYPES, dtype=object)[rng.integers(0, len(TYPES), n)]),
            "queue": pa.array(np.array(QUEUES, dtype=object)[rng.integers(0, len(QUEUES), n)]),
            "endpoint": pa.array(["bench"] * n),
            "sent": pa.array(started - queueing).cast(TIMESTAMP),
            "started": pa.array(started).cast(TIMESTAMP),
            "ended": pa.array(ended).cast(TIMESTAMP),
            "outcome": pa.array(outcomes[rng.choice(len(outcomes), n, p=weights)]),
            "attempt": pa.array(rng.integers(1, 3, n).astype(np.int32)),
            # One send in ten was delayed: due a little after it was sent (critical time's start).
            "deliver_at": pa.array(started - queueing // 2, mask=rng.random(n) >= 0.1).cast(TIMESTAMP),
        }, schema=RECORD_SCHEMA)
        dates = pc.cast(table["ended"], pa.date32())
        for day in pc.unique(dates).to_pylist():
            part = table.filter(pc.equal(dates, pa.scalar(day, pa.date32())))
            directory = path / f"{schema.PARTITION}={day.isoformat()}"
            directory.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, directory / schema.record_file_name(done + 1))
        done += n
        progress.update(done)
    progress.done()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline import job

    keep = args.keep is not None
    root = Path(args.keep) if keep else Path(tempfile.mkdtemp(prefix="sluice-bench-pipeline-"))
    try:
        records_path, output = root / "records", root / "metrics"
        if records_path.exists():
            shutil.rmtree(records_path)
        generate(records_path, args.records)
        size = sum(f.stat().st_size for f in records_path.rglob("*.parquet"))
        log(f"data set: {size / 1e6:.0f} MB of Parquet; starting Spark (local[*], "
            f"driver memory {args.driver_memory})")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        started = time.perf_counter()
        spark = job.session("local[*]", app_name="sluice-bench-pipeline", driver_memory=args.driver_memory)
        try:
            result = job.run(spark, str(records_path.resolve()), str(output.resolve()))
            cores = spark.sparkContext.defaultParallelism
        finally:
            spark.stop()
        seconds = time.perf_counter() - started
        log(f"job: {result['windows']} windows in {seconds:.1f} s ({result['seconds']:.1f} s after the session)")
        return {"records": args.records, "seconds": seconds, "records_per_s": rate(args.records, seconds),
                "windows": result["windows"], "job_seconds": result["seconds"],
                "driver_memory": args.driver_memory, "cores": cores}
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return standard_main("pipeline", HELP, add_arguments, run, argv)
