"""The job on a real Spark standalone cluster: a master and one worker on 127.0.0.1 started
with PySpark's own ``spark-class``, the job submitted with ``spark-submit --master
spark://127.0.0.1:PORT pipeline/job.py``, its output checked, both stopped (also on failure).

Spark only (no database): runs once, in the SQLite pass of `make test`."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.pipeline_support import actual_windows, assert_same_windows, expected_windows, make_records, write_dataset

pytestmark = [pytest.mark.spark_only, pytest.mark.slow, pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parent.parent
SUBMIT_TIMEOUT = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def poll_master(ui_port: int, want, proc: subprocess.Popen, log: Path, what: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    state: dict = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
                state = json.loads(r.read())
            if want(state):
                return state
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; last state {state}\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def test_standalone_cluster_runs_the_job(tmp_path):
    records = make_records(1500, dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc), span_s=2 * 3600, seed=11)
    data, output, work = tmp_path / "records", tmp_path / "metrics", tmp_path / "work"
    write_dataset(data, records)
    work.mkdir()
    home = spark_home()
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(work),
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false", "SPARK_LOG_DIR": str(tmp_path)}
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    spark_class = os.path.join(home, "bin", "spark-class")
    master = worker = None
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    try:
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(master_ui)], env=env, stdout=master_log.open("wb"), stderr=subprocess.STDOUT)
        poll_master(master_ui, lambda s: s.get("status") == "ALIVE", master, master_log, "master ALIVE")
        worker = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
             "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui)],
            env=env, stdout=worker_log.open("wb"), stderr=subprocess.STDOUT)
        poll_master(master_ui, lambda s: s.get("aliveworkers") == 1, worker, worker_log, "worker registered")

        submit = subprocess.run(
            [os.path.join(home, "bin", "spark-submit"), "--master", f"spark://127.0.0.1:{port}",
             "--driver-memory", "512m", "--executor-memory", "512m",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
             "--conf", "spark.driver.host=127.0.0.1",
             str(ROOT / "pipeline" / "job.py"), "--input", str(data), "--output", str(output)],
            env=env, capture_output=True, timeout=SUBMIT_TIMEOUT, cwd=tmp_path)
        assert submit.returncode == 0, submit.stderr.decode()[-4000:]
        line = json.loads(submit.stdout.decode().strip().splitlines()[-1])
        assert line["spark_master"] == f"spark://127.0.0.1:{port}"

        rows = pq.read_table(output).to_pylist()
        assert line["windows"] == len(rows)
        assert_same_windows(actual_windows(rows), expected_windows(records))
        # The work ran on the worker's executor, not in the driver.
        assert list(work.glob("app-*/0/stderr")), "no executor ran on the worker"
        state = poll_master(master_ui, lambda s: s.get("completedapps"), master, master_log, "completed app")
        assert state["completedapps"][0]["name"] == "sluice-pipeline"
    finally:
        stop(worker)
        stop(master)
    assert master.returncode is not None and worker.returncode is not None
