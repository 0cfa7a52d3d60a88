"""The Spark job: processing records → metrics per queue, message type and time window.

Runs the same way embedded (Spark local mode, from ``sluice pipeline run``) and on a
cluster::

    spark-submit --master spark://HOST:7077 pipeline/job.py \
        --input /shared/records --output /shared/metrics [--since 2026-11-23T00:00:00Z]

It reads the Parquet data set the exporter writes (pipeline.schema), and writes one
Parquet row per (queue, message type, window start, window size) to ``--output``,
replacing what was there.  Windows are 1 minute and 1 hour, by the time processing
*ended*.  Per window:

- ``messages``: records (every outcome; a retried message counts once per attempt);
  ``throughput_per_s`` = messages / window seconds;
- ``processing_ms_p50/p95/p99``: ended − started of the attempts whose handler ran
  (processed, failed, retried); ``critical_ms_p50/p95/p99``: NServiceBus's critical time,
  ended − (DeliverAt ?? TimeSent), of the processed ones;
- ``failures`` (failed + retried + error_queue), ``failure_rate`` = failures / messages,
  ``retries``, ``expired``, ``dead_lettered``.

A record id met twice (a crash between an export's rename and its watermark) counts once.
Percentiles come from Spark's ``percentile_approx`` with accuracy
:data:`PERCENTILE_ACCURACY`: for n values the rank returned lies within
floor((p − 1/accuracy)·n) … ceil((p + 1/accuracy)·n) — the exact nearest-rank value up to
about 5,000 values per window, at most ceil(n / 10,000) ranks from it beyond
(docs/pipeline.md).

``--since`` limits the run to records that ended at or after the start of that hour
(windows are whole hours or minutes, so every window it writes is complete); the
``date`` partition prunes the files it reads.  The job never imports Django or Sluice:
it ships to a cluster as is, and only DataFrame functions run on the executors (no
Python UDFs), so executors need no Python packages of ours.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from typing import Any

try:  # run as a file by spark-submit: make `pipeline` importable
    from pipeline import schema
except ImportError:  # pragma: no cover - depends on how spark-submit was called
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from pipeline import schema

#: percentile_approx's accuracy: rank error at most ceil(n / 10,000) for a window of n values.
PERCENTILE_ACCURACY = 10_000
PERCENTILES = (0.5, 0.95, 0.99)

#: Spark settings the job wants unless the deployment already sets them (spark-submit
#: ``--conf``, spark-defaults.conf, SLUICE_SPARK_CONF): quiet logs, hash-based object
#: aggregates for many groups.  No shuffle partition count here: :func:`run` derives it
#: from the cluster's parallelism unless one is given.  The UI is a caller's choice.
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "WARN",
    # percentile_approx is an object aggregate: keep it hash-based for many groups.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "200000",
}
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


def hour_floor(moment: dt.datetime) -> dt.datetime:
    """The start of ``moment``'s hour, in UTC (a run's lower bound: whole windows only)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def parse_conf(items: list[str] | str) -> dict[str, str]:
    """Spark settings from ``key=value`` items, or one string of them (whitespace or
    newlines between), or a JSON object — SLUICE_SPARK_CONF's forms.  ValueError names a bad one."""
    if isinstance(items, str):
        text = items.strip()
        if text.startswith("{"):
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("a JSON Spark configuration must be an object")
            return {str(k): str(v) for k, v in data.items()}
        items = text.split()
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"a Spark setting must look like key=value, not {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def parse_since(text: str) -> dt.datetime:
    """An ISO 8601 instant (``Z`` or an offset; naive means UTC)."""
    value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    value = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    # In UTC: an offset such as +19:25 is valid ISO 8601 but out of PostgreSQL's range.
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:
        raise ValueError(f"{text!r} is out of range in UTC") from None


def session(master: str | None = None, *, app_name: str = "sluice-pipeline", ui: bool = False,
            driver_memory: str | None = None, extra: dict[str, str] | None = None):
    """A SparkSession with the job's settings, or the one already running, left as it is
    (a notebook's on Databricks, a test's).

    ``master`` None leaves it to spark-submit (``--master``) or Spark's default.
    ``extra`` (SLUICE_SPARK_CONF) always applies; :data:`BASE_CONF` only where neither it
    nor spark-submit set the key.  ``driver_memory`` only matters when this call starts
    the JVM (plain ``python``); under spark-submit it belongs on its command line."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is not None:
        return SparkSession.builder.getOrCreate()
    if master and master.startswith("local"):
        # An embedded JVM: bind loopback (the hostname may resolve oddly), and run any
        # Python workers with this interpreter (the venv), not the first python3 on PATH.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    given: set[str] = set()
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit: its JVM is up, with its --conf
        SparkContext._ensure_initialized()
        given = {key for key, _ in SparkConf().getAll()}
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    conf = {key: value for key, value in BASE_CONF.items() if key not in given}
    if "spark.ui.enabled" not in given:
        conf["spark.ui.enabled"] = "true" if ui else "false"
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    _shuffle_partitions(spark)  # here, not in run(): a shared session's settings are not ours to change
    return spark


def _shuffle_partitions(spark) -> None:
    """Unless set, shuffle partitions = 4 per core of the cluster (at least 8): enough
    for a big cluster's parallelism; adaptive execution merges the small ones."""
    sc = spark.sparkContext
    if not sc.getConf().contains(SHUFFLE_PARTITIONS) and spark.conf.get(SHUFFLE_PARTITIONS) == "200":
        spark.conf.set(SHUFFLE_PARTITIONS, str(max(8, 4 * sc.defaultParallelism)))


def _records(spark, input_path: str, since: dt.datetime | None):
    """The records as the aggregates need them, each record id once, partitioned by
    (queue, message type, hour): one shuffle serves the de-duplication and both window
    sizes (a minute lies within its hour, so every group is in one partition)."""
    from pyspark.sql import functions as F

    df = spark.read.schema(_read_schema()).parquet(input_path)
    if since is not None:
        start = hour_floor(since)
        df = df.where(F.col(schema.PARTITION) >= F.lit(start.date())).where(F.col("ended") >= F.lit(start))
    micros = F.unix_micros
    rows = df.select(
        "id",
        "queue",
        F.coalesce(F.col("message_type"), F.lit("")).alias("message_type"),
        _window_start("ended", 3600).alias("hour"),
        "ended",
        # Outcome flags as integers, computed once per row: the aggregates only add them.
        *[F.col("outcome").isin(*outcomes).cast("int").alias(name) for name, outcomes in FLAGS.items()],
        F.when(F.col("outcome").isin(*schema.HANDLER_RAN),
               (micros("ended") - micros("started")) / 1000.0).alias("processing_ms"),
        # NServiceBus's critical time: ProcessingEnded − (DeliverAt ?? TimeSent).
        F.when(F.col("outcome") == schema.PROCESSED,
               (micros("ended") - micros(F.coalesce("deliver_at", "sent"))) / 1000.0).alias("critical_ms"),
    )
    # A record exported twice (a crash between a file's rename and the watermark) counts once.
    return rows.repartition(*GROUP).dropDuplicates(["id", *GROUP])


#: What every window's group starts with (and the records are partitioned by).
GROUP = ("queue", "message_type", "hour")


def _window_start(column: str, seconds: int):
    """The start of the ``seconds`` window ``column`` falls in, from the epoch (no time zone)."""
    from pyspark.sql import functions as F

    return F.timestamp_seconds(F.floor(F.unix_seconds(F.col(column)) / seconds) * seconds)


#: Counted columns of a window and the outcomes each one counts.
FLAGS = {
    "failures": schema.FAILURES,
    "retries": (schema.RETRIED,),
    "expired": (schema.EXPIRED,),
    "dead_lettered": (schema.DEAD_LETTERED,),
}


def _read_schema():
    """The data set's columns plus the ``date`` partition (declared, so an empty or
    new data set needs no schema inference)."""
    from pyspark.sql import types as T

    from pipeline.arrow_schema import RECORD_SCHEMA, TIMESTAMP

    spark_type = {"int64": T.LongType(), "int32": T.IntegerType(), "string": T.StringType()}
    fields = []
    for f in RECORD_SCHEMA:
        kind = T.TimestampType() if f.type == TIMESTAMP else spark_type[str(f.type)]
        fields.append(T.StructField(f.name, kind, True))
    fields.append(T.StructField(schema.PARTITION, T.DateType(), True))
    return T.StructType(fields)


def metrics(spark, input_path: str, since: dt.datetime | None = None):
    """The result DataFrame: one row per queue, message type and window (both sizes)."""
    from pyspark.sql import functions as F

    records = _records(spark, input_path, since)

    pct = F.array(*[F.lit(p) for p in PERCENTILES])
    results = None
    for seconds in schema.WINDOWS:
        assert 3600 % seconds == 0, "a window must lie within one hour (the records' partitioning)"
        g = records.groupBy(*GROUP, _window_start("ended", seconds).alias("window_start")).agg(
            F.count(F.lit(1)).alias("messages"),
            F.percentile_approx("processing_ms", pct, PERCENTILE_ACCURACY).alias("p"),
            F.percentile_approx("critical_ms", pct, PERCENTILE_ACCURACY).alias("c"),
            *[F.sum(name).cast("long").alias(name) for name in FLAGS],
        )
        rows = g.select(
            "queue", "message_type", "window_start",
            F.lit(seconds).alias("window_seconds"),
            "messages",
            (F.col("messages") / F.lit(float(seconds))).alias("throughput_per_s"),
            *[F.col("p")[i].alias(f"processing_ms_p{int(p * 100)}") for i, p in enumerate(PERCENTILES)],
            *[F.col("c")[i].alias(f"critical_ms_p{int(p * 100)}") for i, p in enumerate(PERCENTILES)],
            (F.col("failures") / F.col("messages")).alias("failure_rate"),
            "failures", "retries", "expired", "dead_lettered",
        )
        results = rows if results is None else results.unionByName(rows)
    return results.select(*schema.METRIC_COLUMNS)


def run(spark, input_path: str, output_path: str, since: dt.datetime | None = None) -> dict[str, Any]:
    """Compute the metrics and write them to ``output_path`` (replacing it); returns
    ``{"windows": N, "seconds": S, "shuffle_partitions": P}``.  An input path with no data set yet gives none."""
    started = time.monotonic()
    if not _has_records(spark, input_path):
        frame = spark.createDataFrame([], metrics_schema())
    else:
        frame = metrics(spark, input_path, since)
    # No coalesce(n) here: it would run the aggregation itself in n tasks.  Adaptive
    # execution already merges small shuffle partitions, so a small run writes few files.
    # The write ends with a _SUCCESS marker, which the loader insists on (core.records.results).
    frame.write.mode("overwrite").parquet(output_path)
    windows = spark.read.parquet(output_path).count()
    return {"windows": windows, "seconds": round(time.monotonic() - started, 3),
            "shuffle_partitions": int(spark.conf.get(SHUFFLE_PARTITIONS))}


def _has_records(spark, input_path: str) -> bool:
    """True when ``input_path`` exists (a fresh installation has exported nothing yet)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(input_path)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(path))


def metrics_schema():
    from pyspark.sql import types as T

    longs = {"window_seconds", "messages", "failures", "retries", "expired", "dead_lettered"}
    fields = []
    for name in schema.METRIC_COLUMNS:
        if name in ("queue", "message_type"):
            kind = T.StringType()
        elif name == "window_start":
            kind = T.TimestampType()
        elif name in longs:
            kind = T.LongType()
        else:
            kind = T.DoubleType()
        fields.append(T.StructField(name, kind, True))
    return T.StructType(fields)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipeline/job.py", description="Sluice metrics from processing records (a Spark job).")
    parser.add_argument("--input", required=True, help="the records data set (SLUICE_RECORDS_PATH)")
    parser.add_argument("--output", required=True, help="where the metric windows go (Parquet, replaced)")
    parser.add_argument("--since", type=parse_since, default=None,
                        help="only records that ended in or after this instant's hour (ISO 8601, UTC)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable); spark-submit's own --conf works too")
    parser.add_argument("--master", default=None,
                        help="Spark master when not started by spark-submit (default: spark-submit's, "
                             "else local[*])")
    return parser


def main(argv: list[str] | None = None) -> int:
    from pyspark import SparkContext

    args = build_parser().parse_args(argv)
    ours = SparkContext._active_spark_context is None  # Databricks shares one: not ours to stop
    spark = session(args.master, extra=parse_conf(args.conf))
    try:
        result = run(spark, args.input, args.output, args.since)
        result["spark_master"] = spark.sparkContext.master
    finally:
        if ours:
            spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
