"""`python -m benchmarks export` runs and prints its one JSON line; the pipeline benchmark's
generator writes a data set the exporter's schema describes (its Spark run is the same
job tests/test_pipeline_job.py checks)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pyarrow.dataset as ds

from benchmarks.pipeline import generate
from pipeline import schema
from pipeline.arrow_schema import RECORD_SCHEMA
from tests.conftest import ROOT

# A SQLite database of its own (benchmarks/common.py): one pass of `make test` is enough.
pytestmark = pytest.mark.no_database


def test_the_export_benchmark_prints_one_json_line():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "export", "--db", "sqlite", "--records", "3000"],
                            cwd=ROOT, capture_output=True, timeout=180)
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    data = json.loads(lines[0])
    assert data["records"] == 3000 and data["database"] == "sqlite" and data["export_per_s"] > 0


def test_the_pipeline_benchmark_generates_the_exported_layout(tmp_path):
    generate(tmp_path, 5000, span_s=2 * 86_400)
    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 5000 and sorted(set(table["id"].to_pylist())) == list(range(1, 5001))
    assert table.schema.remove(table.schema.get_field_index("date")) == RECORD_SCHEMA
    assert set(table["outcome"].to_pylist()) == set(schema.OUTCOMES)
    assert len({str(d) for d in table["date"].to_pylist()}) >= 2
