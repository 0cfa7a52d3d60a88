"""Sluice inside real Celery workers (`celery -A workers worker|beat` as child processes).

Every test gets a private ``redis-server`` on a free port (the broker, the result backend
and the health heartbeats), so Redis can be stopped and restarted without disturbing
anybody else.  The workers use the test database (``tests.conftest.database_url()``).

- scale-out: two workers share the ``demo`` queue, the delayed mover and the periodic
  tasks — every message handled once, both took part, the purge never ran twice at once;
- SIGTERM: in-flight messages finish, the worker exits 0, nothing is lost;
- SIGKILL mid-batch of the pump, the mover, a purge run and a bulk retry: nothing lost,
  nothing done twice once a worker is back;
- Redis down for ``OUTAGE`` seconds: messages keep flowing, status says so, heartbeats and
  beat's tasks come back;
- PostgreSQL down for ``OUTAGE`` seconds (a TCP proxy between the worker and the server is
  cut): breakers trigger, the worker stays up, everything resumes, exactly once.

``SLUICE_TEST_OUTAGE_SECONDS`` sets the outage length (default 30; 10 keeps CI short).
"""
from __future__ import annotations

import os
import time
from urllib.parse import quote

import pytest
from django.db import connection

from core import failures
from core.demo.models import PingRecord
from core.messages import Headers, wire_time
from core.models import BulkOperation, BulkOperationStatus, FailedMessage, FailureStatus
from core.transport import Transport
from tests.celery_support import (CeleryCluster, RedisServer, all_task_runs, clear_delayed, delayed_count,
                                  delayed_ids, one_snapshot, overlapping, ping_ids, queue_ids)
from tests.conftest import put_row, wait_for
from tests.tcp_proxy import TcpProxy

#: Seconds Redis / PostgreSQL stay down in the outage tests.
OUTAGE = float(os.environ.get("SLUICE_TEST_OUTAGE_SECONDS", "30"))


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def cluster(demo, redis_server, tmp_path):
    """Start Celery processes with ``cluster.workers(n)`` / ``cluster.beat()``; all are stopped
    (and stragglers killed) before the database is cleaned up.  Their output is printed at
    teardown (pytest shows it when the test fails)."""
    clear_delayed()
    c = CeleryCluster(redis_server, tmp_path)
    yield c
    c.stop_all()
    c.report()
    clear_delayed()


def send_pings(n: int, **options) -> list[str]:
    return Transport().send_many("demo", [{"n": i} for i in range(n)], message_type="Ping", **options)


def assert_exactly_once(expected: list[str]) -> None:
    handled = ping_ids()
    duplicates = sorted({i for i in handled if handled.count(i) > 1}) if len(handled) != len(set(handled)) else []
    assert not duplicates, f"handled more than once: {duplicates[:10]}"
    missing = set(expected) - set(handled)
    assert not missing, f"{len(missing)} message(s) never handled, e.g. {sorted(missing)[:5]}"
    assert sorted(handled) == sorted(expected)


def wait_pings(n: int, timeout: float, what: str = "") -> None:
    wait_for(lambda: PingRecord.objects.count() >= n, timeout=timeout, interval=0.1,
             what=what or f"{n} pings handled")


# -- 1. scale out -----------------------------------------------------------------------------------

@pytest.mark.postgresql
def test_two_celery_workers_share_the_queue_the_mover_and_the_periodic_tasks(cluster, make_queue):
    expiring = make_queue("expiring")
    # One expired row per purge statement: a purge run over 200 rows lasts long enough that
    # runs started together really overlap unless the task lease keeps them apart.
    env = {"SLUICE_PURGE_BATCH_SIZE": "1"}
    workers = cluster.workers(2, env)
    beat = cluster.beat(env)
    t = Transport()

    # Slow messages first keep both workers' pumps busy, so both take part.
    t.send_many("demo", [{"seconds": 0.05} for _ in range(40)], message_type="Slow")
    now_ids = send_pings(400)
    # Through the delayed store and the (elected) mover: due in 1–3 s.
    later_ids = [t.send("demo", {"n": i}, message_type="Ping", delay=1 + i % 3) for i in range(200)]
    expired_ids = t.send_many(expiring, [{"n": i} for i in range(200)], message_type="Ping", ttl=0)
    assert t.counts(expiring).expired == 200
    # Beat sends purge-expired every second; four more at once make runs contend for the lease.
    client = cluster.client()
    burst = [client.send_task("sluice.purge_expired") for _ in range(4)]
    burst_results = [r.get(timeout=60) for r in burst]

    wait_pings(600, 90)
    wait_for(lambda: t.counts(expiring).total == 0, timeout=30, interval=0.2, what="expired messages purged")
    wait_for(lambda: t.counts("demo").total == 0 and delayed_count() == 0, timeout=30, what="demo drained")
    # Two more purge rounds from beat, with nothing left to do: none may touch a row twice.
    purges = lambda: sum(len(w.task_runs("sluice.purge_expired")) for w in workers)  # noqa: E731
    before = purges()
    wait_for(lambda: purges() >= before + 2, timeout=20, interval=0.2, what="two more purge rounds")

    for w in workers:
        w.sigterm()
    assert [w.terminate() for w in workers] == [0, 0]
    assert beat.terminate() == 0

    # Every Ping exactly once — the 400 sent at once and the 200 that went through the mover.
    assert_exactly_once(now_ids + later_ids)
    assert not set(expired_ids) & set(ping_ids())  # purged, never handled

    # Both workers processed messages; between them every demo message exactly once.
    stats = [w.summaries().get("demo") for w in workers]
    assert all(stats), [w.tail() for w in workers]
    assert all(s["received"] > 0 for s in stats), stats
    assert sum(s["received"] for s in stats) == sum(s["handled"] for s in stats) == 640, stats
    assert all(s["retried"] == s["errored"] == s["expired"] == s["poison"] == 0 for s in stats), stats

    # Beat's periodic tasks (not counting the burst sent above) ran on both workers.
    burst_ids = {r.id for r in burst}
    for w in workers:
        assert [r for r in w.task_runs() if r.id not in burst_ids], f"{w.name} ran no periodic task"

    # Expired messages purged once: the runs that did work removed exactly the 200 rows, and
    # no two of them ran at the same time (the lease); contenders were turned away.
    runs = all_task_runs(workers, "sluice.purge_expired")
    assert burst_results and all(isinstance(r, dict) for r in burst_results)
    worked = [r for r in runs if "skipped" not in r.result]
    skipped = [r for r in runs if "skipped" in r.result]
    assert sum(r.result.get(expiring, 0) for r in worked) == 200, [r.result for r in worked]
    assert not overlapping(worked), overlapping(worked)
    assert skipped, "no purge run ever met a running one: the lease was not put to the test"
    # Each turned-away run started while a run that worked was going on.
    for s in skipped:
        assert any(w.started - 0.05 <= s.started <= w.ended + 0.05 for w in worked), s

    for proc in [*workers, beat]:
        assert not proc.error_lines(), f"{proc.name}: {proc.error_lines()}"
    print(f"purge runs: {len(worked)} worked, {len(skipped)} turned away; received per worker: "
          f"{[s['received'] for s in stats]}")


# -- 2. graceful shutdown ----------------------------------------------------------------------------

def test_sigterm_finishes_in_flight_messages_and_a_second_worker_drains_the_rest(cluster):
    t = Transport()
    # Batches of four: Slow, Ping, Slow, Ping — a batch lasts a second, and its Pings commit
    # only when the whole batch (the receive's transaction) does.
    env = {"SLUICE_RECEIVE_BATCH_SIZE": "4"}
    ping_sent = []
    for i in range(16):
        t.send("demo", {"seconds": 0.5}, message_type="Slow")
        ping_sent.append(t.send("demo", {"n": i}, message_type="Ping"))

    first = cluster.worker(env)
    wait_pings(1, 30, "the first batch committed")
    first.sigterm()  # SIGTERM right after a commit: the next batches are in flight
    at_signal = PingRecord.objects.count()
    assert first.terminate(45) == 0
    after_exit = PingRecord.objects.count()

    stats = first.summaries()["demo"]
    assert "Sluice loops stopped (some did not finish" not in first.text
    assert first.count(r"Sluice loops stopped$") == 1, first.tail()
    # Whatever it had received, it finished: nothing rolled back half-done.
    assert stats["received"] == stats["handled"] > 0 and stats["retried"] == stats["errored"] == 0, stats
    assert after_exit > at_signal, "no in-flight batch was finished after SIGTERM"
    assert after_exit <= stats["received"]
    assert t.counts("demo").total == 32 - stats["received"]
    assert not first.error_lines(), first.error_lines()

    second = cluster.worker(env)
    wait_pings(16, 60, "the second worker drained the rest")
    wait_for(lambda: t.counts("demo").total == 0, timeout=30, what="demo empty")
    assert second.terminate() == 0
    assert_exactly_once(ping_sent)
    assert stats["received"] + second.summaries()["demo"]["received"] == 32


# -- 3. SIGKILL mid-batch ----------------------------------------------------------------------------

def test_sigkill_during_receive_batches_loses_and_duplicates_nothing(cluster):
    t = Transport()
    # Pings with a short Slow in every few batches: the pump's transactions are open most of
    # the time, and the stream lasts seconds, so the kill lands in it even when this process
    # is slow to see the 200th Ping (a CI run with 20 ms Slows once finished before it).
    sent = []
    for chunk in range(60):
        t.send_many("demo", [{"seconds": 0.05}], message_type="Slow")
        sent += send_pings(25)
    first = cluster.worker()
    wait_pings(200, 60, "the pump under way")
    first.kill()
    # At any instant a message is either still in the queue or handled — never both, never neither.
    left = queue_ids("demo")
    handled = ping_ids()
    assert 0 < len(handled) < 1500, "the worker was not killed mid-stream"
    assert len(set(handled)) == len(handled)
    assert not set(handled) & set(left)
    assert set(sent) <= set(handled) | set(left)

    second = cluster.worker()
    wait_pings(1500, 90)
    wait_for(lambda: t.counts("demo").total == 0, timeout=30, what="demo empty")
    assert second.terminate() == 0
    assert_exactly_once(sent)


def test_sigkill_while_the_mover_moves_a_burst_of_due_messages(cluster):
    import datetime as dt

    t = Transport()
    # The thousand stored in one send_many (a thousand sends, even in one transaction,
    # outlasted the delay on a machine under load), all due at one instant well after it.
    due = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=10)
    sent = t.send_many("demo", [{"n": i} for i in range(1000)], message_type="Ping", deliver_at=due)
    assert dt.datetime.now(dt.timezone.utc) < due, "sending took longer than the delay"
    assert delayed_count() == 1000
    # Ten per transaction: the burst takes a hundred of them.
    env = {"SLUICE_DELAYED_BATCH_SIZE": "10"}
    first = cluster.worker(env)
    wait_for(lambda: 0 < 1000 - delayed_count(), timeout=60, interval=0.02, what="the mover under way")
    first.kill()
    # Read in one snapshot: the killed worker's last COMMIT may still land on the server
    # between three separate reads (one CI run counted ten messages twice so).
    stored, queued, handled = one_snapshot(delayed_ids, lambda: queue_ids("demo"), ping_ids)
    assert stored, "the mover had moved everything before the kill"
    # Each message is in exactly one place: the store, the queue or the business table.
    assert len(stored) + len(queued) + len(handled) == 1000, (len(stored), len(queued), len(handled))
    assert set(stored) | set(queued) | set(handled) == set(sent)

    second = cluster.worker(env)  # takes over the mover once the dead one's lease lapses (3 s)
    wait_pings(1000, 90)
    wait_for(lambda: delayed_count() == 0 and t.counts("demo").total == 0, timeout=30, what="all moved and handled")
    assert second.terminate() == 0
    assert_exactly_once(sent)


def test_sigkill_during_a_purge_run(cluster, make_queue):
    t = Transport()
    q = make_queue("expiring")
    live = t.send_many(q, [{"live": i} for i in range(50)], message_type="Ping")
    t.send_many(q, [{"n": i} for i in range(6000)], message_type="Ping", ttl=0)
    live += t.send_many(q, [{"live": i} for i in range(50)], message_type="Ping")
    assert t.counts(q).expired == 6000
    env = {"SLUICE_PURGE_BATCH_SIZE": "10"}  # 600 statements: a run lasts a while
    first = cluster.worker(env)
    cluster.client().send_task("sluice.purge_expired")
    first.wait_line(r"Task sluice\.purge_expired\[.*\] received", timeout=30)
    wait_for(lambda: t.counts(q).total < 6100, timeout=30, interval=0.02, what="the purge under way")
    first.kill()
    # A purge batch whose COMMIT left the killed worker before the kill still lands: count
    # once the table has stopped changing, or the runs after would be compared with a count
    # one batch too high.
    left = settled(lambda: t.counts(q))
    assert left.expired > 0, "the purge had finished before the kill"
    assert left.total - left.expired == 100
    assert sorted(queue_ids(q))  # readable

    # Back with beat: the dead run's lease turns runs away until it lapses, then one finishes.
    # One run is asked for at once, ahead of beat: it waits in Redis for the new worker, so a
    # run meets the lease even when a loaded machine starts the worker and beat slowly (the
    # lease lapses 9 s after the kill).
    cluster.client().send_task("sluice.purge_expired")
    second = cluster.worker(env)
    beat = cluster.beat(env)
    wait_for(lambda: t.counts(q).expired == 0, timeout=60, interval=0.2, what="the purge finished")
    assert beat.terminate() == 0
    assert second.terminate() == 0
    assert sorted(queue_ids(q)) == sorted(live), "the purge removed a live message"
    runs = second.task_runs("sluice.purge_expired")
    assert sum(r.result.get(q, 0) for r in runs if "skipped" not in r.result) == left.expired
    assert any("skipped" in r.result for r in runs), "the killed run's lease was not held"
    assert not overlapping([r for r in runs if "skipped" not in r.result])


def settled(read, pause: float = 0.5, timeout: float = 10.0):
    """``read()`` once two readings ``pause`` apart agree."""
    value, deadline = read(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(pause)
        again = read()
        if again == value:
            return value
        value = again
    raise AssertionError(f"still changing after {timeout} s: {value}")


def failed_ping_ids(n: int) -> list[str]:
    """``n`` failed Pings of the demo queue in the error queue, ingested into failed-message records."""
    from django.utils import timezone

    headers = {Headers.FAILED_Q: "demo", Headers.EXCEPTION_TYPE: "builtins.ValueError",
               Headers.EXCEPTION_MESSAGE: "boom", Headers.TIME_OF_FAILURE: wire_time(timezone.now()),
               Headers.EXCEPTION_STACK_TRACE: 'Traceback:\n  File "core/demo/handlers.py", line 1, in ping\n'}
    ids = [put_row("error", {"n": i}, message_type="Ping", headers=headers) for i in range(n)]
    assert failures.ingest_errors() == n
    return ids


def test_sigkill_during_a_bulk_retry_then_the_operation_is_run_again(cluster):
    t = Transport()
    ids = failed_ping_ids(600)
    op = failures.retry(failures.all_unresolved(queue="demo"), requested_by="test")
    assert op.total == 600
    # A task-only worker: what the retry sends back stays in the queue to be counted.
    env = {"SLUICE_RETRY_BATCH_SIZE": "3", "SLUICE_CELERY_HOST_LOOPS": "0"}
    first = cluster.worker(env)
    cluster.client().send_task("sluice.run_bulk_operation", args=[op.pk])
    wait_for(lambda: BulkOperation.objects.get(pk=op.pk).done >= 30, timeout=60, interval=0.02,
             what="the retry under way")
    first.kill()
    op.refresh_from_db()
    assert op.status == BulkOperationStatus.RUNNING and op.done < 600, (op.status, op.done)
    # Exactly the committed batches were sent: the killed batch rolled back with its records.
    queued = queue_ids("demo")
    assert len(queued) == len(set(queued)) == op.done and op.done % 3 == 0
    assert FailedMessage.objects.filter(status=FailureStatus.RETRY_PENDING).count() == op.done
    assert set(queued) <= set(ids)

    # Run it again with the task on a full worker (its pump handles what comes back).
    second = cluster.worker({"SLUICE_RETRY_BATCH_SIZE": "3"})
    result = cluster.client().send_task("sluice.run_bulk_operation", args=[op.pk]).get(timeout=90)
    assert result == {"id": op.pk, "status": "finished", "done": 600, "failed": 0, "total": 600}
    wait_pings(600, 60)
    wait_for(lambda: t.counts("demo").total == 0, timeout=30, what="demo empty")
    assert second.terminate() == 0
    # Every failed message went back exactly once (a duplicate row would be handled twice).
    assert_exactly_once(ids)
    wait_for(lambda: FailedMessage.objects.filter(status=FailureStatus.RESOLVED).count() == 600, timeout=10,
             what="records resolved")


# -- 4. Redis outage -------------------------------------------------------------------------------------

def test_redis_outage_messages_keep_flowing_and_beat_and_heartbeats_come_back(cluster, make_queue):
    t = Transport()
    expiring = make_queue("expiring")
    worker = cluster.worker()
    beat = cluster.beat()
    wait_for(lambda: cluster.heartbeat(worker), timeout=20, interval=0.5, what="the heartbeat")
    t.send_many(expiring, [{} for _ in range(20)], message_type="Ping", ttl=0)
    wait_for(lambda: t.counts(expiring).total == 0, timeout=20, interval=0.2, what="a purge before the outage")

    cluster.redis.stop()
    down_at = time.monotonic()
    assert cluster.status()["redis"] == "down"
    # Sent during the outage: straight to the queue, and through the delayed store.
    sent = send_pings(50)
    sent += [t.send("demo", {"n": i}, message_type="Ping", delay=2) for i in range(20)]
    t.send_many(expiring, [{} for _ in range(100)], message_type="Ping", ttl=0)
    wait_pings(70, max(OUTAGE - 3, 5), "pings handled while Redis is down")
    assert_exactly_once(sent)
    time.sleep(max(0.0, down_at + OUTAGE - 3 - time.monotonic()))
    status = cluster.status()
    assert status["redis"] == "down" and status["workers"] == []
    assert t.counts(expiring).total == 100, "something purged without beat"
    assert worker.alive and beat.alive
    time.sleep(max(0.0, down_at + OUTAGE - time.monotonic()))

    mark = worker.mark()
    outage = time.monotonic() - down_at
    cluster.redis.start()
    back_at = time.monotonic()
    wait_for(lambda: cluster.heartbeat(worker), timeout=30, interval=0.5, what="the heartbeat back")
    worker.wait_line(r"Redis is back after", start=mark, timeout=10)
    wait_for(lambda: t.counts(expiring).total == 0, timeout=60, interval=0.5,
             what="beat's purge running again after Redis returned")
    purged_after = time.monotonic() - back_at
    after = send_pings(10)
    wait_pings(80, 30)
    assert worker.alive and beat.alive
    assert worker.terminate() == 0
    assert beat.terminate() == 0
    assert_exactly_once(sent + after)
    # The loops never failed a step: Redis is not on their path.
    assert not worker.count(r"step failed|TRIGGERED")
    print(f"Redis was down for {outage:.1f} s; expired rows purged {purged_after:.1f} s after it returned")


# -- 5. PostgreSQL outage ---------------------------------------------------------------------------------

@pytest.mark.postgresql
def test_postgresql_outage_triggers_breakers_and_everything_resumes_exactly_once(cluster, make_queue):
    t = Transport()
    expiring = make_queue("expiring")
    s = connection.settings_dict
    with TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)) as proxy:
        url = f"postgresql://{quote(s['USER'])}:{quote(s['PASSWORD'] or '')}@127.0.0.1:{proxy.port}/{s['NAME']}"
        env = {f"SLUICE_TIME_TO_TRIGGER_{b}_BREAKER": "2" for b in ("STORE", "FETCH", "DISPATCH", "RECEIVE")}
        # A short mover lease: the mover renews it (outside any transaction) at nearly every
        # step, so that is where it meets the dead connection first — as an idle mover with
        # the default lease does — rather than inside a batch's transaction.
        env["SLUICE_MOVER_LEASE_SECONDS"] = "1"
        worker = cluster.worker(env, database=url)
        beat = cluster.beat(env)
        wait_for(lambda: cluster.heartbeat(worker), timeout=20, interval=0.5, what="the heartbeat")
        before = send_pings(20)
        wait_pings(20, 30)

        # Due while the database is unreachable: 2 s after the cut until 2 s before the end.
        span = max(OUTAGE - 4, 1)
        delayed = [t.send("demo", {"n": i}, message_type="Ping", delay=2 + span * i / 100) for i in range(100)]
        mark = worker.mark()
        proxy.cut()
        cut_at = time.monotonic()
        during = send_pings(30)  # the test's own connection does not go through the proxy
        t.send_many(expiring, [{} for _ in range(50)], message_type="Ping", ttl=0)

        worker.wait_line(r"CRITICAL sluice\.breakers: circuit breaker \S+ TRIGGERED", start=mark, timeout=OUTAGE)
        triggered = wait_for(
            lambda: [b["name"] for b in (cluster.heartbeat(worker) or {}).get("breakers", [])
                     if b["state"] == "triggered"],
            timeout=max(OUTAGE - (time.monotonic() - cut_at) - 1, 3), interval=0.5,
            what="sluice status showing a triggered breaker")
        health = cluster.heartbeat(worker)
        assert all(loop["alive"] for loop in health["loops"]), health["loops"]
        time.sleep(max(0.0, cut_at + OUTAGE - time.monotonic()))
        assert worker.alive, worker.tail()
        # Nothing got through while the link was cut.
        assert PingRecord.objects.count() == 20
        assert delayed_count() == 100
        assert t.counts(expiring).total == 50
        outage = time.monotonic() - cut_at
        proxy.restore()

        try:
            wait_pings(150, 60, "everything handled after the database came back")
        except AssertionError as exc:
            health = cluster.heartbeat(worker) or {}
            stuck = {b["name"]: (b["state"], b["last_error"][:80]) for b in health.get("breakers", [])
                     if b["state"] != "closed"}
            raise AssertionError(f"{exc}: {PingRecord.objects.count()} of 150 pings handled, "
                                 f"{delayed_count()} still in the delayed store, "
                                 f"{t.counts('demo').total} in the queue; breakers not closed: {stuck}") from None
        wait_for(lambda: delayed_count() == 0 and t.counts("demo").total == 0, timeout=30, what="all moved")
        wait_for(lambda: t.counts(expiring).total == 0, timeout=30, interval=0.5, what="the periodic purge again")
        try:
            wait_for(lambda: all(b["state"] == "closed" for b in cluster.heartbeat(worker)["breakers"]),
                     timeout=30, interval=0.5, what="every breaker closed again")
        except AssertionError as exc:
            open_ = {b["name"]: (b["state"], b["last_error"][:120]) for b in cluster.heartbeat(worker)["breakers"]
                     if b["state"] != "closed"}
            raise AssertionError(f"{exc}: {open_}") from None
        assert worker.alive
        assert worker.terminate() == 0
        assert beat.terminate() == 0
    assert_exactly_once(before + delayed + during)
    assert worker.count(r"TRIGGERED") >= 1
    print(f"PostgreSQL was unreachable for {outage:.1f} s; triggered: {triggered}")
