"""`python -m benchmarks transport` and `delayed`: run end to end and print their JSON line
with the keys the README promises (old ones kept)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connections

from tests.conftest import ROOT, database_url


def run_benchmark(*argv: str, env: dict | None = None) -> dict:
    result = subprocess.run([sys.executable, "-m", "benchmarks", *argv], cwd=ROOT, capture_output=True, timeout=240,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_the_transport_benchmark_prints_its_figures():
    data = run_benchmark("transport", "--db", "sqlite", "--messages", "60", "--handler", "orm",
                         "--peek-delay", "0.05")
    old = {"send_per_s", "receive_per_s", "receive_after_ready_per_s", "e2e_per_s", "messages", "db", "duplicates"}
    new = {"drain_per_s", "latency_ms_p50", "latency_ms_p99", "send_many_per_s", "idle_pickup_ms_p99",
           "handler", "batch_size", "concurrency"}
    assert old | new <= set(data)
    assert data["messages"] == 60 and data["handler"] == "orm" and data["duplicates"] == 0
    assert data["drained"] == 120  # the single sends and the send_many batch, each handled once
    for key in ("drain_per_s", "e2e_per_s", "send_many_per_s"):
        assert data[key] > 0, key
    # Polling every 50 ms (SQLite: no cross-process wake-up): a pick-up within a few polls.
    assert 0 <= data["idle_pickup_ms_p99"] < 1000
    # The traced drains: every span of the first exported to the local OTLP receiver, and
    # the overhead against the control drain (a figure, whatever its sign on a busy machine).
    assert data["otel_spans_exported"] == 120 and data["drain_otel_per_s"] > 0 and data["drain_control_per_s"] > 0
    assert isinstance(data["otel_overhead_pct"], float) and isinstance(data["otel_sampled_overhead_pct"], float)
    assert 0 <= data["otel_sampled_spans_exported"] < 120 and data["otel_sampled_ratio"] == 0.1
    assert isinstance(data["otel_sampled_1pct_overhead_pct"], float) and data["drain_otel_sampled_1pct_per_s"] > 0
    assert 0 <= data["otel_sampled_1pct_spans_exported"] < 120


def test_the_otel_cost_benchmark_compares_tracing_off_and_on_in_one_process():
    data = run_benchmark("otel_cost", "--db", "sqlite", "--messages", "40", "--rounds", "2")
    assert data["benchmark"] == "otel_cost" and data["messages"] == 40 and data["rounds"] == 2
    for variant in ("off", "every", "10pct", "1pct"):
        assert data[f"cpu_us_per_msg_{variant}"] > 0 and data[f"wall_us_per_msg_{variant}"] > 0, variant
    for suffix in ("", "_10pct", "_1pct"):  # what tracing adds: a figure, whatever its sign on a busy machine
        added = data[f"otel_cpu_us_per_msg{suffix}"]
        off = data["cpu_us_per_msg_off"]
        assert isinstance(added, float) and data[f"otel_cpu_overhead_pct{suffix}"] == pytest.approx(100 * added / off, abs=1)


def test_the_otel_cost_benchmark_counts_instructions_under_callgrind_when_asked():
    # valgrind comes with scripts/bootstrap.sh (make test's set-up).
    data = run_benchmark("otel_cost", "--db", "sqlite", "--messages", "20", "--rounds", "1", "--instructions", "60")
    assert data["instructions_messages"] == 60
    counts = {variant: data[f"instructions_per_msg_{variant}"] for variant in ("off", "every", "10pct", "1pct")}
    assert all(isinstance(count, int) and count > 10_000 for count in counts.values()), counts
    # Every message traced costs more instructions than none: a count, not a clock, so no noise flips it.
    assert counts["every"] > counts["off"] and data["otel_instructions_pct"] > 0
    assert data["otel_instructions_pct"] == pytest.approx(100 * (counts["every"] / counts["off"] - 1), abs=0.1)


def test_the_delayed_benchmark_reports_lateness_at_the_handler_and_the_movers():
    data = run_benchmark("delayed", "--db", "sqlite", "--messages", "40", "--rate", "200", "--lead", "1",
                         "--peek-delay", "0.05")
    assert {"lateness_ms_p50", "lateness_ms_p99", "lateness_ms_max", "forward_lateness_ms_p99"} <= set(data)
    assert data["early"] == 0 and data["duplicates"] == 0
    assert data["lateness_ms_p50"] >= data["forward_lateness_ms_p50"]  # handled after it was forwarded


@pytest.mark.postgresql
def test_on_postgresql_an_idle_worker_picks_up_sends_from_another_process_by_notification():
    # A peek delay of 10 s: a pick-up well under it comes from the NOTIFY wake-up.
    name = connections["default"].settings_dict["NAME"]
    data = run_benchmark("transport", "--db", "postgresql", "--messages", "60", "--peek-delay", "10",
                         env={"SLUICE_BENCH_POSTGRES_URL": database_url().rsplit("/", 1)[0] + "/postgres",
                              "SLUICE_BENCH_DATABASE": f"{name}_bench"})
    assert data["db"] == "postgresql" and data["duplicates"] == 0 and data["drained"] == 120
    assert data["idle_pickup_ms_p99"] < 1000
    assert data["latency_ms_p99"] < 5000
