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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A master and one worker (1 core, 1 GB) on 127.0.0.1, free ports; stopped afterwards."""
    tmp = tmp_path_factory.mktemp("cluster")
    work = tmp / "work"
    work.mkdir()
    home = spark_home()
    env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_WORKER_DIR": str(work), "SPARK_LOCAL_DIRS": str(work),
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false", "SPARK_LOG_DIR": str(tmp)}
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    spark_class = os.path.join(home, "bin", "spark-class")
    master = worker = None
    master_log, worker_log = tmp / "master.log", tmp / "worker.log"
    try:
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(master_ui)], env=env, stdout=master_log.open("wb"), stderr=subprocess.STDOUT)
        poll_master(master_ui, lambda s: s.get("status") == "ALIVE", master, master_log, "master ALIVE")
        worker = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host",
             "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui)],
            env=env, stdout=worker_log.open("wb"), stderr=subprocess.STDOUT)
        poll_master(master_ui, lambda s: s.get("aliveworkers") == 1, worker, worker_log,
                    "worker registered")
        yield Cluster(f"spark://127.0.0.1:{port}", env, work, lambda: poll_master(
            master_ui, lambda s: True, master, master_log, "master state"))
    finally:
        stop(worker)
        stop(master)
    assert master.returncode is not None and worker.returncode is not None


class Cluster:
    def __init__(self, url: str, env: dict, work: Path, state) -> None:
        self.url, self.env, self.work, self.state = url, env, work, state

    def submit(self, *args: str, env: dict | None = None, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [os.path.join(self.env["SPARK_HOME"], "bin", "spark-submit"), "--master", self.url,
             "--driver-memory", "512m", "--executor-memory", "512m",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN",
             "--conf", "spark.driver.host=127.0.0.1", *args],
            env=env or self.env, capture_output=True, timeout=SUBMIT_TIMEOUT, cwd=cwd)

    def apps_done(self) -> list[str]:
        return [app["name"] for app in self.state().get("completedapps", [])]


def dataset(tmp_path: Path, seed: int) -> tuple[Path, list[dict]]:
    records = make_records(1500, dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc), span_s=2 * 3600,
                           seed=seed)
    write_dataset(tmp_path / "records", records)
    return tmp_path / "records", records


def test_standalone_cluster_runs_the_job(cluster, tmp_path):
    data, records = dataset(tmp_path, 11)
    output = tmp_path / "metrics"
    submit = cluster.submit(str(ROOT / "pipeline" / "job.py"), "--input", str(data), "--output", str(output),
                            cwd=tmp_path)
    assert submit.returncode == 0, submit.stderr.decode()[-4000:]
    line = json.loads(submit.stdout.decode().strip().splitlines()[-1])
    assert line["spark_master"] == cluster.url
    assert line["shuffle_partitions"] == 8  # derived: 4 per core of the cluster, at least 8

    rows = pq.read_table(output).to_pylist()
    assert line["windows"] == len(rows)
    assert_same_windows(actual_windows(rows), expected_windows(records))
    # The work ran on the worker's executor, not in the driver.
    assert list(cluster.work.glob("app-*/0/stderr")), "no executor ran on the worker"
    assert "sluice-pipeline" in cluster.apps_done()


#: Hides the checkout from the driver's Python: ``pipeline`` can only come from --py-files.
NO_CHECKOUT = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path[:] = [p for p in sys.path if p.rstrip("/") != %r]
"""


def test_spark_submit_with_the_packaged_zip(cluster, tmp_path):
    """`sluice pipeline package` → spark-submit --py-files: the main script lives outside the
    checkout, the driver cannot import the checkout, spark-submit's --conf wins over the
    job's defaults."""
    from core.records import package

    data, records = dataset(tmp_path, 12)
    built = package.build(str(tmp_path / "ship"))
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_CHECKOUT % str(ROOT))
    env = {**cluster.env, "PYTHONPATH": str(site)}
    command = built.spark_submit(str(data), str(tmp_path / "metrics"))
    submit = cluster.submit("--conf", "spark.sql.shuffle.partitions=3", *command[1:], env=env, cwd=tmp_path)
    assert submit.returncode == 0, submit.stderr.decode()[-4000:]
    line = json.loads(submit.stdout.decode().strip().splitlines()[-1])
    assert line["spark_master"] == cluster.url and line["shuffle_partitions"] == 3
    assert_same_windows(actual_windows(pq.read_table(tmp_path / "metrics").to_pylist()), expected_windows(records))

    # Cluster deploy mode: Spark's standalone master runs no Python driver (YARN and
    # Kubernetes do: docs/pipeline.md); spark-submit says so at once.
    refused = cluster.submit("--deploy-mode", "cluster", *command[1:], env=env, cwd=tmp_path)
    assert refused.returncode != 0
    assert b"not supported for python applications on standalone clusters" in refused.stderr


EMBEDDED = """
import datetime as dt, json, sys
import django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from core.models.records import MetricWindow
from core.records.run import run_pipeline
from core.records.writer import insert_rows
records = json.load(open(sys.argv[1]))
insert_rows([(r["message_id"], r["message_type"], r["queue"], r["endpoint"], r["sent"], r["started"], r["ended"],
              r["outcome"], r["attempt"], r["deliver_at"]) for r in records], "default")
result = run_pipeline()
windows = [{**w, "window_start": w["window_start"].isoformat()} for w in MetricWindow.objects.values()]
print(json.dumps({"run": result.json(), "windows": windows}))
"""


def test_embedded_client_mode_against_the_cluster(cluster, tmp_path):
    """`sluice pipeline run` with SLUICE_SPARK_MASTER=spark://…: the driver in this process,
    executors on the worker, settings for reaching the driver from SLUICE_SPARK_CONF."""
    records = make_records(1200, dt.datetime(2026, 11, 23, 8, 0, tzinfo=dt.timezone.utc), span_s=2 * 3600,
                           seed=13)
    (tmp_path / "records.json").write_text(json.dumps(records))
    (tmp_path / "embedded.py").write_text(EMBEDDED)
    env = {**cluster.env, "DJANGO_SETTINGS_MODULE": "sluice.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "SLUICE_SPARK_MASTER": cluster.url, "SLUICE_SPARK_DRIVER_MEMORY": "512m",
           "SLUICE_SPARK_CONF": "spark.driver.host=127.0.0.1 spark.driver.bindAddress=127.0.0.1 "
                                "spark.executor.memory=512m spark.cores.max=1",
           "SLUICE_RECORDS_PATH": str(tmp_path / "records"), "SLUICE_METRICS_PATH": str(tmp_path / "metrics")}
    before = len(list(cluster.work.glob("app-*")))
    done = subprocess.run([sys.executable, str(tmp_path / "embedded.py"), str(tmp_path / "records.json")],
                          env=env, cwd=ROOT, capture_output=True, timeout=SUBMIT_TIMEOUT)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out["run"]["spark_master"] == cluster.url and out["run"]["exported"] == 1200
    windows = [{**w, "window_start": dt.datetime.fromisoformat(w["window_start"])} for w in out["windows"]]
    assert_same_windows(actual_windows(windows), expected_windows(records))
    assert len(list(cluster.work.glob("app-*"))) == before + 1, "no executor ran on the worker"
