"""`python -m benchmarks horizon`: a steady load through one worker while a session holds an
xid (PostgreSQL, a database of its own on the server, `sluice_bench_horizon`), and its one
JSON line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.horizon import summarise
from tests.conftest import ROOT

pytestmark = pytest.mark.no_database


def test_the_horizon_benchmark_runs_a_held_window_and_reports_it():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "horizon", "--rate", "1000", "--batch", "20",
                             "--duration", "22", "--hold-from", "1", "--hold-for", "20"],
                            cwd=ROOT, capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["benchmark"] == "horizon" and data["db"] == "postgresql" and data["rate"] == 1000
    assert b"horizon held" in result.stderr and b"horizon released" in result.stderr
    assert len(data["windows_pct"]) == 2  # 0–10 s before the hold, 10–20 s inside it
    assert data["worst_held_ratio"] is not None and data["worst_held_pct"] == data["windows_pct"][1]
    assert data["sent_per_s"] > 500 and data["max_backlog_s"] >= 0 and data["recovery_s"] is not None


def test_a_hold_that_outlasts_the_load_is_refused():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "horizon", "--duration", "10", "--hold-from", "5",
                             "--hold-for", "10"], cwd=ROOT, capture_output=True, timeout=60)
    assert result.returncode != 0 and b"--hold-from + --hold-for <= --duration" in result.stderr
    assert result.stdout == b""


def seconds(s: float) -> int:
    return int(s * 1e9)


def test_the_figures_from_commits_and_records():
    """100/s offered for 30 s; the worker stops for 10 s inside a hold from 10 s to 25 s and
    catches up 2 s after the release."""
    commits = [(seconds(t / 10), 10) for t in range(300)]  # 10 messages every 0.1 s, 0–29.9 s
    handled = []
    for t, count in commits:
        at = t if not seconds(12) <= t < seconds(22) else seconds(27)  # held back until 27 s
        handled += [at] * count
    figures = summarise(commits, handled, 0, 10.0, 25.0)
    assert figures["windows_pct"] == [100.0, 20.0]  # 10–20 s: 2 s of 10 handled; 20–29.9 s: no whole window
    assert figures["worst_held_pct"] == 20.0 and figures["worst_held_ratio"] == 0.2
    assert figures["max_backlog_s"] == pytest.approx(10.0, rel=0.01)  # the 10 s sent from 12 s to 22 s
    assert figures["recovery_s"] == pytest.approx(2.0, abs=0.2)
