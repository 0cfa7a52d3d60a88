"""`python -m benchmarks costs`: counts a handled message's statements, WAL bytes and CPU
on PostgreSQL (a database of its own on the server, `sluice_bench_costs`) and prints its
one JSON line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.costs import VARIANTS
from tests.conftest import ROOT

pytestmark = pytest.mark.no_database


def test_the_costs_benchmark_counts_every_variant():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "costs", "--messages", "40"],
                            cwd=ROOT, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["benchmark"] == "costs" and data["messages"] == 40 and data["db"] == "postgresql"
    for variant in VARIANTS:
        assert data[f"{variant}_wal_bytes"] > 0 and data[f"{variant}_db_cpu_us"] >= 0
    # What the variants are for: a relay writes, the outbox writes more.  (Records add one
    # statement per batch, which 40 messages cannot tell from an extra receive; and not WAL:
    # it is the server's, and other tests' sessions write to it too.)
    assert data["relay_statements_per_100"] > data["noop_statements_per_100"]
    assert data["relay_outbox_statements_per_100"] > data["relay_statements_per_100"]


def test_the_costs_benchmark_runs_against_a_table_that_already_holds_records():
    """``--records R`` fills the records' table first (ids made as send() makes them) and
    says so in its line; a count below 0 is refused before anything runs."""
    result = subprocess.run([sys.executable, "-m", "benchmarks", "costs", "--messages", "40", "--records", "25000"],
                            cwd=ROOT, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(result.stdout.decode().splitlines()[-1])
    assert data["records"] == 25000 and data["messages"] == 40
    refused = subprocess.run([sys.executable, "-m", "benchmarks", "costs", "--records", "-5"],
                             cwd=ROOT, capture_output=True, timeout=60)
    assert refused.returncode == 2 and b"--records: must be 0 or more, not -5" in refused.stderr
