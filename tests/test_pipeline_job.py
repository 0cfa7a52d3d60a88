"""The Spark job in local mode on generated records: every figure of every window against
the same figures computed in plain Python (tests/pipeline_support.py)."""
from __future__ import annotations

import datetime as dt

import pyarrow.parquet as pq
import pytest

from pipeline import job
from tests.pipeline_support import (
    actual_windows, assert_same_windows, expected_windows, make_records, us, write_dataset,
)

pytestmark = pytest.mark.spark_only
START = dt.datetime(2026, 11, 22, 22, 0, tzinfo=dt.timezone.utc)  # crosses midnight: two date partitions


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    records = make_records(4000, START, span_s=3 * 3600, gap=(600, 720))
    path = tmp_path_factory.mktemp("records")
    write_dataset(path, records)
    return path, records


@pytest.fixture(scope="module")
def full_run(spark, dataset, tmp_path_factory):
    """One run over the whole data set, shared by the tests that only read its output."""
    return run_job(spark, dataset[0], tmp_path_factory.mktemp("full"))


def run_job(spark, path, tmp_path, since=None):
    out = tmp_path / "metrics"
    result = job.run(spark, str(path), str(out), since)
    rows = pq.read_table(out).to_pylist()
    assert result["windows"] == len(rows)
    return rows


def test_every_metric_of_every_window(full_run, dataset):
    path, records = dataset
    rows = full_run
    expected = expected_windows(records)
    assert_same_windows(actual_windows(rows), expected)
    assert {(r["window_seconds"]) for r in rows} == {60, 3600}


def test_an_empty_minute_has_no_window_and_its_hour_counts_the_rest(full_run, dataset):
    path, records = dataset
    windows = actual_windows(full_run)
    gap_minutes = [us(START) + m * 60_000_000 for m in (10, 11)]
    assert not [k for k in windows if k[3] == 60 and k[2] in gap_minutes]
    hour = windows[("a", "Order", us(START), 3600)]
    assert hour["messages"] == sum(1 for r in records if r["queue"] == "a" and r["message_type"] == "Order"
                                   and r["ended"] < us(START) + 3_600_000_000)


def test_a_queue_with_only_failures(full_run):
    doomed = {k: v for k, v in actual_windows(full_run).items() if k[0] == "doomed"}
    assert doomed
    for figures in doomed.values():
        assert figures["failure_rate"] == 1.0
        assert figures["critical_ms_p99"] is None  # nothing was processed
        assert figures["processing_ms_p50"] is not None  # the failed attempts ran


def test_since_computes_whole_hours_from_its_hour(spark, dataset, tmp_path):
    path, records = dataset
    since = START + dt.timedelta(hours=1, minutes=25)
    rows = run_job(spark, path, tmp_path, since)
    assert_same_windows(actual_windows(rows), expected_windows(records, us(since)))
    assert min(r["window_start"] for r in rows).replace(tzinfo=dt.timezone.utc) == START + dt.timedelta(hours=1)


def test_no_data_set_yet_gives_no_windows(spark, tmp_path):
    assert run_job(spark, tmp_path / "nothing-exported-yet", tmp_path) == []


def test_command_line_options():
    # main() itself runs under spark-submit in tests/test_pipeline_cluster.py.
    args = ["--input", "in", "--output", "out", "--since", "2026-11-23T00:30:00+01:00"]
    parsed = job.build_parser().parse_args(args)
    assert parsed.since == dt.datetime(2026, 11, 22, 23, 30, tzinfo=dt.timezone.utc)
    assert job.build_parser().parse_args(["--input", "i", "--output", "o"]).since is None
    with pytest.raises(SystemExit):
        job.build_parser().parse_args(["--input", "x", "--output", "y", "--since", "not a time"])
