"""Sluice's own health, made to happen for real: no worker at all or fewer than N
(workers_below); Redis cut off from a worker (redis_down, seen by the evaluator that worker
hosts, through a TCP proxy that resets every connection); the database cut off from a
worker process while the evaluator still reaches it (database_down, from the worker's
breakers in its heartbeat).  Each fires, and resolves once the cut is restored."""
from __future__ import annotations

import pytest
from django.db import connection

from core.alerts.evaluator import evaluate
from core.models.alerts import AlertState, RuleKind
from core.runtime.health import read_health, worker_name
from core.worker import WorkerHost
from tests.alerts_support import own_alerts_queue, rule, states, target, wait_for  # noqa: F401 (fixtures)
from tests.conftest import database_url, start_worker
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_alerts_queue")]


def test_no_worker_at_all_and_fewer_workers_than_wanted(queue, target, temp_handlers, settings):
    temp_handlers(queue, None, lambda message, context: None)
    mine = {"worker": worker_name()}  # this process's workers only (other tests' may linger in Redis)
    any_worker = rule(RuleKind.WORKERS_BELOW, threshold=1, filters=mine)
    two = rule(RuleKind.WORKERS_BELOW, name="two workers", threshold=2, filters=mine)
    evaluate()
    assert states(any_worker) == [AlertState.FIRING], "no worker was ever seen: still an alert"
    assert any_worker.alerts.get().summary.startswith("no worker")
    host = WorkerHost([queue], mover=False, alerts=False, redis_url=settings.REDIS_URL).start()
    try:
        wait_for(lambda: worker_name() in [w["name"] for w in read_health(settings.REDIS_URL)["workers"]])
        evaluate()
        assert states(any_worker) == [AlertState.RESOLVED]
        assert states(two) == [AlertState.FIRING], "one live worker is fewer than two"
    finally:
        host.stop()
    evaluate()
    assert states(any_worker) == [AlertState.RESOLVED, AlertState.FIRING]


def test_redis_cut_off_from_a_worker(queue, target, temp_handlers, settings):
    """The worker hosts the evaluator (as every worker does); its Redis goes through a proxy."""
    temp_handlers(queue, None, lambda message, context: None)
    settings.SLUICE_ALERTS_INTERVAL = 0.2
    r = rule(RuleKind.REDIS_DOWN)
    host, port = settings.REDIS_URL.split("//", 1)[1].split("/", 1)[0].split(":")
    with TcpProxy(host, int(port)) as proxy:
        settings.REDIS_URL = f"redis://127.0.0.1:{proxy.port}/{settings.REDIS_URL.rsplit('/', 1)[1]}"
        worker = WorkerHost([queue], mover=False, alerts=True, redis_url=settings.REDIS_URL).start()
        try:
            wait_for(lambda: read_health(settings.REDIS_URL)["workers"])
            assert states(r) == []
            proxy.cut()
            wait_for(lambda: states(r) == [AlertState.FIRING], timeout=15, what="redis_down to fire")
            proxy.restore()
            wait_for(lambda: states(r) == [AlertState.RESOLVED], timeout=15, what="redis_down to resolve")
        finally:
            worker.stop()
    summary = r.alerts.get().summary
    assert summary.startswith("Redis is unreachable")


def test_database_cut_off_from_a_worker_process(queue, target, settings):
    """A ``sluice worker`` process reaches the database through a proxy; the evaluator (this
    process) reaches it directly: the worker's receive breaker, in its heartbeat, says it."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no connection to cut: the database is a file in the worker's process")
    r = rule(RuleKind.DATABASE_DOWN)
    s = connection.settings_dict
    direct = f"@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/"
    with TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)) as proxy:
        env = {"DATABASE_URL": database_url().replace(direct, f"@127.0.0.1:{proxy.port}/"),
               "REDIS_URL": settings.REDIS_URL, "SLUICE_ALERTS_ENABLED": "0", "SLUICE_PEEK_DELAY": "0.05",
               "SLUICE_TIME_TO_TRIGGER_RECEIVE_BREAKER": "1"}
        assert env["DATABASE_URL"] != database_url()
        worker = start_worker("--queue", queue, "--no-mover", env=env)
        try:
            evaluate()
            assert states(r) == []
            proxy.cut()
            wait_for(lambda: evaluate() is not None and states(r) == [AlertState.FIRING], timeout=30,
                     interval=0.5, what="database_down to fire")
            alert = r.alerts.get()
            assert alert.labels["breaker"] == f"pump-receive:{queue}" and alert.labels["worker"].endswith(
                f":{worker.pid}"), alert.labels
            proxy.restore()
            wait_for(lambda: evaluate() is not None and states(r) == [AlertState.RESOLVED], timeout=30,
                     interval=0.5, what="database_down to resolve")
        finally:
            worker.terminate()
            worker.wait(30)
