"""`sluice worker` as a whole deployment: with no Celery beat beside it, the worker that runs
the mover also runs the periodic clean-ups (core.maintenance) under the leases beat's tasks
take, so two such workers, or a worker and beat, never run the same job at once."""
from __future__ import annotations

from django.test import override_settings

from core.maintenance import JOBS, MaintenanceLoop, exclusive, run_job
from core.models import FailedMessage
from core.queues import create_queue
from core.transport import Transport
from core.worker import WorkerHost
from tests.conftest import wait_for


@override_settings(SLUICE_IMMEDIATE_RETRIES=0, SLUICE_DELAYED_RETRIES=0, SLUICE_INGEST_INTERVAL=0.2,
                   SLUICE_PURGE_INTERVAL=0.2)
def test_a_worker_with_the_mover_ingests_failures_and_purges_expired_messages(demo, error_queue):
    transport = Transport()
    create_queue("maintenance-ttl")
    transport.send("maintenance-ttl", {"n": 1}, ttl=0.01)
    failed = transport.send("demo", {"n": 1}, message_type="Fail")
    host = WorkerHost(["demo"], concurrency=1, maintenance=None).start()  # `sluice worker`'s choice
    try:
        wait_for(lambda: FailedMessage.objects.filter(message_id=failed).exists(), timeout=30,
                 what="the failed message ingested by the worker itself")
        wait_for(lambda: transport.counts("maintenance-ttl").total == 0, timeout=30,
                 what="the expired message purged by the worker itself")
    finally:
        host.stop()
    assert any(type(loop) is MaintenanceLoop for loop in host.runner.loops)


def test_a_worker_left_to_beat_runs_no_clean_up(demo):
    without = WorkerHost(["demo"], concurrency=1, maintenance=False)
    no_mover = WorkerHost(["demo"], concurrency=1, mover=False)
    for host in (without, no_mover):
        assert not any(type(loop) is MaintenanceLoop for loop in host.runner.loops)


def test_a_job_whose_lease_is_held_elsewhere_is_skipped(demo):
    """The same lease as the Celery task: a worker's loop and beat never run a job twice."""
    with exclusive("ingest_errors") as mine:
        assert mine
        assert run_job("ingest_errors") == JOBS["ingest_errors"].skipped


def test_the_loop_waits_until_the_next_job_is_due(demo):
    with override_settings(SLUICE_INGEST_INTERVAL=7.0, SLUICE_PURGE_INTERVAL=60.0,
                           SLUICE_IDLE_QUEUE_INTERVAL=60.0, SLUICE_ARCHIVE_PURGE_INTERVAL=3600.0):
        first = MaintenanceLoop().step()  # every job runs at the first step
        assert 6.0 < first <= 7.0  # then the soonest, error ingestion, is 7 s away
