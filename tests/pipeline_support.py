"""Generated processing records and their metrics computed in plain Python — the
independent answer the Spark job's output is checked against (shares no code with it)."""
from __future__ import annotations

import datetime as dt
import math
import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

HOUR_US = 3_600_000_000
ALL = ["processed", "failed", "retried", "expired", "dead_lettered", "error_queue"]


def us(moment: dt.datetime) -> int:
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def make_records(count: int, start: dt.datetime, *, span_s: int = 3 * 3600, seed: int = 1,
                 gap: tuple[int, int] | None = None, first_id: int = 1) -> list[dict[str, Any]]:
    """``count`` records over ``span_s`` seconds from ``start``: queues a/b with two types
    each, every outcome, plus queue ``doomed`` whose every attempt fails.  Nothing ends in
    ``gap`` (start, end) seconds after ``start``: an empty window."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        offset = rng.randrange(span_s * 1_000_000)
        if gap and gap[0] * 1_000_000 <= offset < gap[1] * 1_000_000:
            offset = gap[1] * 1_000_000 + offset % 1_000_000
        ended = us(start) + offset
        if i % 10 == 0:
            queue, mtype, outcome = "doomed", "Charge", rng.choice(["failed", "retried"])
        else:
            queue = rng.choice(["a", "b"])
            mtype = rng.choice(["Order", "Invoice"])
            outcome = rng.choices(ALL, weights=[80, 4, 6, 4, 3, 3])[0]
        if outcome == "error_queue" and rng.random() < 0.3:
            mtype = None  # a poison row: no type
        processing = rng.randrange(100, 900_000) if outcome in ("processed", "failed", "retried") else 0
        started = ended - processing
        sent = None if rng.random() < 0.05 else started - rng.randrange(0, 5_000_000)
        # A delayed send: due later than sent (critical time counts from DeliverAt).
        deliver_at = sent + rng.randrange(0, 2_000_000) if sent is not None and rng.random() < 0.2 else None
        rows.append({"id": first_id + i, "message_id": f"m{first_id + i}", "message_type": mtype, "queue": queue,
                     "endpoint": "test", "sent": sent, "started": started, "ended": ended, "outcome": outcome,
                     "attempt": 1 + (outcome == "retried"), "deliver_at": deliver_at})
    return rows


def write_dataset(path: Path, records: list[dict[str, Any]]) -> None:
    """The records as a hive-partitioned Parquet data set (date=YYYY-MM-DD)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ts = pa.timestamp("us", tz="UTC")
    by_date: dict[str, list] = defaultdict(list)
    for r in records:
        by_date[dt.datetime.fromtimestamp(r["ended"] / 1e6, dt.timezone.utc).date().isoformat()].append(r)
    for date, rows in by_date.items():
        table = pa.table({
            "id": pa.array([r["id"] for r in rows], pa.int64()),
            "message_id": [r["message_id"] for r in rows],
            "message_type": pa.array([r["message_type"] for r in rows], pa.string()),
            "queue": [r["queue"] for r in rows],
            "endpoint": [r["endpoint"] for r in rows],
            "sent": pa.array([r["sent"] for r in rows], pa.int64()).cast(ts),
            "started": pa.array([r["started"] for r in rows], pa.int64()).cast(ts),
            "ended": pa.array([r["ended"] for r in rows], pa.int64()).cast(ts),
            "outcome": [r["outcome"] for r in rows],
            "attempt": pa.array([r["attempt"] for r in rows], pa.int32()),
            "deliver_at": pa.array([r.get("deliver_at") for r in rows], pa.int64()).cast(ts),
        })
        (path / f"date={date}").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path / f"date={date}" / f"part-{rows[0]['id']}.parquet")


def nearest_rank(values: list[float], p: float) -> float | None:
    """The smallest value with at least p of all values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def expected_windows(records: Iterable[dict[str, Any]], since_us: int | None = None) -> dict[tuple, dict]:
    """Every (queue, type, window start µs, seconds) → its figures, by hand."""
    groups: dict[tuple, list] = defaultdict(list)
    for r in records:
        if since_us is not None and r["ended"] < since_us - since_us % HOUR_US:
            continue
        for seconds in (60, 3600):
            size = seconds * 1_000_000
            groups[(r["queue"], r["message_type"] or "", r["ended"] - r["ended"] % size, seconds)].append(r)
    out = {}
    for key, rows in groups.items():
        n = len(rows)
        processing = [(r["ended"] - r["started"]) / 1000 for r in rows
                      if r["outcome"] in ("processed", "failed", "retried")]
        # NServiceBus: ProcessingEnded − (DeliverAt ?? TimeSent).
        critical = [(r["ended"] - (r.get("deliver_at") or r["sent"])) / 1000 for r in rows
                    if r["outcome"] == "processed" and (r.get("deliver_at") or r["sent"])]
        failures = sum(r["outcome"] in ("failed", "retried", "error_queue") for r in rows)
        out[key] = {
            "messages": n, "throughput_per_s": n / key[3],
            "processing_ms_p50": nearest_rank(processing, 0.5), "processing_ms_p95": nearest_rank(processing, 0.95),
            "processing_ms_p99": nearest_rank(processing, 0.99),
            "critical_ms_p50": nearest_rank(critical, 0.5), "critical_ms_p95": nearest_rank(critical, 0.95),
            "critical_ms_p99": nearest_rank(critical, 0.99),
            "failures": failures, "failure_rate": failures / n,
            "retries": sum(r["outcome"] == "retried" for r in rows),
            "expired": sum(r["outcome"] == "expired" for r in rows),
            "dead_lettered": sum(r["outcome"] == "dead_lettered" for r in rows),
        }
    return out


def actual_windows(rows: Iterable[dict[str, Any]]) -> dict[tuple, dict]:
    """Result rows (the job's Parquet, or MetricWindow values) keyed like expected_windows."""
    out = {}
    for row in rows:
        start = row["window_start"]
        if start.tzinfo is None:
            start = start.replace(tzinfo=dt.timezone.utc)
        key = (row["queue"], row["message_type"], us(start), row["window_seconds"])
        assert key not in out, f"window {key} twice"
        out[key] = {k: v for k, v in row.items() if k not in ("queue", "message_type", "window_start",
                                                           "window_seconds", "id")}
    return out


def assert_same_windows(actual: dict[tuple, dict], expected: dict[tuple, dict]) -> None:
    assert sorted(actual) == sorted(expected)
    for key, figures in expected.items():
        got = actual[key]
        for name, value in figures.items():
            if value is None:
                assert got[name] is None, (key, name, got[name])
            else:
                assert got[name] == __import__("pytest").approx(value, rel=1e-9, abs=1e-9), (key, name, got[name], value)
