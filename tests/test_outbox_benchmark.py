"""`python -m benchmarks outbox`: runs end to end and prints its one JSON line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

# A SQLite database of its own (benchmarks/common.py): one pass of `make test` is enough.
pytestmark = pytest.mark.no_database


def test_the_outbox_benchmark_prints_one_json_line():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "outbox", "--db", "sqlite", "--messages", "60",
                             "--concurrency", "2", "--peek-delay", "0.1"],
                            cwd=ROOT, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert {"e2e_per_s", "outbox_overhead_pct", "messages", "db"} <= set(data)
    assert data["messages"] == 60 and data["db"] == "sqlite" and data["e2e_per_s"] > 0
    assert isinstance(data["outbox_overhead_pct"], float)
