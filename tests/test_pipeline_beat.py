"""The beat entry of the analytics pipeline and the lease that keeps it to one run at a time."""
from __future__ import annotations

import threading

import pytest
from django.test.utils import override_settings

from core.runtime.lease import Lease
from core.models.records import PipelineRun
from core.records.run import LEASE, LEASE_SECONDS


@pytest.fixture
def quiet_records(tmp_path, settings):
    settings.SLUICE_RECORDS_PATH = str(tmp_path / "records")
    settings.SLUICE_METRICS_PATH = str(tmp_path / "metrics")


def test_beat_runs_the_pipeline_every_interval():
    from workers.celery import app, beat_schedule

    entry = beat_schedule()["analytics-pipeline"]
    assert entry["task"] == "sluice.run_pipeline" and entry["schedule"] == 3600.0
    assert entry["options"]["expires"] == 3600.0
    with override_settings(SLUICE_PIPELINE_INTERVAL=120):
        assert beat_schedule()["analytics-pipeline"]["schedule"] == 120
    assert "sluice.run_pipeline" in app.tasks
    with override_settings(SLUICE_PIPELINE_INTERVAL=0):
        with pytest.raises(ValueError, match="SLUICE_PIPELINE_INTERVAL"):
            beat_schedule()


def test_the_task_runs_and_records_its_run(transactional_db, quiet_records):
    from workers.tasks import run_pipeline

    # Nothing exported yet: export finds nothing, no Spark job, the run still succeeds.
    assert run_pipeline() == {"exported": 0, "windows": 0, "seconds": pytest.approx(0, abs=30),
                              "spark_master": "local[*]", "since": None, "held_back": 0, "held_reason": "",
                              "deleted": 0}
    run = PipelineRun.objects.get()
    assert (run.status, run.trigger, run.progress) == ("succeeded", "beat", 100)
    assert Lease(LEASE, LEASE_SECONDS, "default").acquire()  # released after the run


def test_a_run_while_another_holds_the_lease_is_skipped(transactional_db, quiet_records):
    from workers.tasks import run_pipeline

    other = Lease(LEASE, LEASE_SECONDS, "default")  # another worker's run in progress
    assert other.acquire()
    try:
        assert run_pipeline() == {"skipped": 1}
        assert PipelineRun.objects.get().status == "skipped"
    finally:
        other.release()
    assert run_pipeline()["exported"] == 0
    assert list(PipelineRun.objects.order_by("id").values_list("status", flat=True)) == ["skipped", "succeeded"]


@pytest.mark.postgresql
def test_two_workers_at_once_one_runs(transactional_db, quiet_records):
    """Two tasks started together from two threads (two connections): exactly one takes the
    lease; the other is skipped or runs strictly after (never both at once)."""
    from workers.tasks import run_pipeline

    results, barrier = [], threading.Barrier(2)

    def worker():
        from django.db import connection
        try:
            barrier.wait()
            results.append(run_pipeline())
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    runs = list(PipelineRun.objects.order_by("started_at"))
    ran = [r for r in runs if r.status == "succeeded"]
    assert len(results) == 2 and len(ran) >= 1
    if len(ran) == 2:
        assert ran[0].finished_at <= ran[1].started_at
    else:
        assert {"skipped": 1} in results
