"""/metrics (Prometheus text, no login) and the statistics snapshot behind it and the
overview: bounded counts, a queue whose table is unreadable, Redis down, worker heartbeats."""
from __future__ import annotations


import pytest
import redis
from django.db import connection
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from core.runtime.health import KEY_PREFIX, HealthPublisher
from core.transport import Transport
from dashboard.counting import stats
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message  # noqa: F401


def samples(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


@pytest.fixture
def heartbeat(settings):
    """A worker heartbeat in Redis with a triggered breaker and 42 processed messages, written by
    the real publisher."""
    publisher = HealthPublisher(settings.REDIS_URL, lambda: [], name="test-worker", processed=lambda: 42)
    snapshot = publisher.snapshot
    publisher.snapshot = lambda: {**snapshot(), "breakers": [{"name": "pump:orders", "state": "triggered"},
                                                             {"name": "mover", "state": "armed"}]}
    publisher.step()
    yield
    redis.Redis.from_url(settings.REDIS_URL).delete(KEY_PREFIX + "test-worker")


def test_metrics_without_login(client, make_queue, error_queue, heartbeat):
    name = make_queue()
    t = Transport()
    t.send(name, "a")
    t.send(name, "b")
    t.send(name, "old", ttl=0)
    fail_message(name)
    values = samples(client)
    assert values[("sluice_queue_pending", (("queue", name),))] == 2
    assert values[("sluice_queue_expired", (("queue", name),))] == 1
    assert values[("sluice_failed_messages", (("status", "unresolved"),))] == 1
    assert values[("sluice_failed_messages", (("status", "archived"),))] == 0
    assert values[("sluice_breaker_triggered", (("breaker", "pump:orders"), ("worker", "test-worker")))] == 1
    assert values[("sluice_breaker_triggered", (("breaker", "mover"), ("worker", "test-worker")))] == 0
    assert values[("sluice_messages_processed_total", (("worker", "test-worker"),))] == 42
    assert values[("sluice_redis_up", ())] == 1


def test_redis_down_is_unknown_not_an_error(client, queue, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    values = samples(client)
    assert values[("sluice_redis_up", ())] == 0 and values[("sluice_queue_pending", (("queue", queue),))] == 0
    assert stats.snapshot(max_age=0).health.redis == "down"


def test_an_unreadable_queue_table_is_an_error_for_that_queue_only(client, make_queue):
    from core.queues import dialect

    broken, fine = make_queue(), make_queue()
    Transport().send(fine, "x")
    with connection.cursor() as cursor:
        for sql, params in dialect().drop_queue_table(broken):
            cursor.execute(sql, params)
    snap = stats.snapshot(max_age=0)
    assert snap.queue(broken).error.startswith("table unreadable") and snap.queue(broken).pending is None
    assert snap.queue(fine).pending == 1 and snap.queue(fine).error == ""
    values = samples(client)
    assert values[("sluice_queue_unreadable", (("queue", broken),))] == 1
    assert ("sluice_queue_pending", (("queue", broken),)) not in values


def test_big_queues_are_estimated_not_counted(queue, settings):
    settings.SLUICE_DASHBOARD_EXACT_COUNT_LIMIT = 5
    t = Transport()
    ids = t.send_many(queue, [f"m{i}" for i in range(12)])
    t.delete(queue, ids[5])  # a gap: the estimate (max − min + 1) does not see it
    q = stats.snapshot(max_age=0).queue(queue)
    assert q.estimated and q.total == 12 and q.pending == 12
    settings.SLUICE_DASHBOARD_EXACT_COUNT_LIMIT = 1000
    q = stats.snapshot(max_age=0).queue(queue)
    assert not q.estimated and q.pending == 11 and q.oldest_age_seconds is not None


@override_settings(SLUICE_DASHBOARD_CACHE_SECONDS=60)  # a loaded machine may take past the 3 s default
def test_one_snapshot_for_many_requests(client, make_queue, django_assert_max_num_queries):
    for _ in range(30):
        make_queue()
    stats.snapshot()
    client.get("/metrics")  # the first scrape also reads the firing alerts (sluice_alerts_firing), cached like it
    with django_assert_max_num_queries(0):
        for _ in range(5):
            assert client.get("/metrics").status_code == 200


def test_a_snapshot_costs_the_same_statements_for_5_or_60_queues(make_queue):
    from django.test.utils import CaptureQueriesContext

    def statements() -> int:
        with CaptureQueriesContext(connection) as captured:
            stats.snapshot(max_age=0)
        return len([q for q in captured.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))])

    for _ in range(5):
        make_queue()
    few = statements()
    for _ in range(55):
        make_queue()
    assert statements() == few + 1  # one more UNION ALL statement per 50 queues


def test_delayed_counts_per_destination(make_queue):
    from core.delayed import delayed_store

    store = delayed_store()
    store.setup_infrastructure()
    name = make_queue()
    ids = [Transport().send(name, "later", delay=3600) for _ in range(3)]
    store.deliver_now(ids[0])
    try:
        q = stats.snapshot(max_age=0).queue(name)
        assert (q.delayed_due, q.scheduled) == (1, 2)
    finally:
        for i in ids:
            store.delete(i)


def test_cached_snapshot_is_shared_through_redis(queue):
    first = stats.snapshot()
    Transport().send(queue, "new")
    stats._local.clear()  # another process: only the shared cache has it
    assert stats.snapshot().at == first.at
    assert stats.snapshot(max_age=0).queue(queue).pending == 1


def test_throughput_from_successive_snapshots(queue, monkeypatch):
    import time as time_module

    clock = [time_module.time()]
    monkeypatch.setattr(stats.time, "time", lambda: clock[0])
    stats.snapshot(max_age=0)
    Transport().send_many(queue, ["x"] * 6)
    clock[0] += 60
    assert stats.snapshot(max_age=0).queue(queue).sent_per_minute == pytest.approx(6, abs=0.5)


def test_a_stale_snapshot_is_served_while_a_thread_refreshes_it(queue, settings):
    import time

    from tests.conftest import wait_for

    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 0.2
    assert stats.snapshot().queue(queue).pending == 0
    Transport().send(queue, "new")
    time.sleep(0.3)
    started = time.perf_counter()
    assert stats.snapshot().queue(queue).pending == 0  # the stale one, at once
    assert time.perf_counter() - started < 0.5
    wait_for(lambda: stats.snapshot().queue(queue).pending == 1, timeout=10, what="the background refresh")


def test_without_background_refresh_the_request_computes(queue, settings):
    import time

    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 0.2
    settings.SLUICE_DASHBOARD_REFRESH_IN_BACKGROUND = False
    stats.snapshot()
    Transport().send(queue, "new")
    time.sleep(0.3)
    assert stats.snapshot().queue(queue).pending == 1
