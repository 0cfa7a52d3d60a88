"""`python -m benchmarks purge`: fills a queue with expired and live rows, purges while a
worker receives, and prints its one JSON line (every live message handled exactly once)."""
from __future__ import annotations

import json
import subprocess
import sys

import os

import pytest
from django.db import connections

from tests.conftest import ROOT, database_url


#: Expired rows: enough that the receivers (several thousand rows/s) cannot drain them all
#: before the purge's first statement gets its turn on a loaded machine (with 3,000, one
#: CI run saw the receivers take every row and the purge remove none; with 20,000, once the
#: receivers set expired rows aside faster, another saw the purge wait 3.4 s for SQLite's
#: write lock and find nothing left).
EXPIRED = 60_000


def run_purge(db: str, env: dict[str, str] | None = None) -> dict:
    """The benchmark, small; it fails (exit code 1) unless every live message was handled
    exactly once and both queues ended empty."""
    result = subprocess.run([sys.executable, "-m", "benchmarks", "purge", "--db", db, "--expired", str(EXPIRED),
                             "--live", "150", "--receivers", "2", "--window", "1"],
                            cwd=ROOT, capture_output=True, timeout=240, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr.decode()[-4000:]
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    data = json.loads(lines[0])
    assert data["benchmark"] == "purge" and data["db"] == db
    assert (data["expired"], data["live"], data["receivers"]) == (EXPIRED, 150, 2)
    assert data["purged_per_s"] > 0 and data["deadlocks"] == 0
    # What the baseline's receivers took is not purged: the purge removes the rest.
    assert 0 < data["purged"] <= EXPIRED
    assert isinstance(data["receiver_drop_pct"], (int, float))
    return data


@pytest.mark.no_database  # a SQLite database of its own: one pass of `make test` is enough
def test_the_purge_benchmark_purges_while_receiving_and_prints_one_json_line():
    run_purge("sqlite")


@pytest.mark.postgresql
def test_on_postgresql_the_purge_benchmark_fills_rows_as_send_lays_them_out():
    # The fill writes the rows in SQL and checks their headers against Transport.build's.
    name = connections["default"].settings_dict["NAME"]
    data = run_purge("postgresql", env={"SLUICE_BENCH_POSTGRES_URL": database_url().rsplit("/", 1)[0] + "/postgres",
                                        "SLUICE_BENCH_DATABASE": f"{name}_bench"})
    assert data["lock_monitor"]["samples"] > 0
