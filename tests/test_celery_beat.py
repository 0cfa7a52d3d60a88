"""Celery beat (`celery -A workers beat` as a child process) stops cleanly on SIGTERM.

Every deploy stops beat, and whenever the signal lands is where beat is.  The test that
matters is the one Celery's own handler failed about once in 25 stops: the signal arriving
while beat waits for the broker to take a task.  A TCP proxy between beat and a private
Redis holds the broker's reply back (``TcpProxy.freeze``), so the signal lands there every
time, not by luck.
"""
from __future__ import annotations

import re
import time

import pytest
import redis

from tests.celery_support import CeleryCluster, RedisServer
from tests.conftest import wait_for
from tests.tcp_proxy import TcpProxy

SENDING = r"Scheduler: Sending due task"


def quiet(proc, pattern: str, seconds: float):
    """A predicate: true once no new line matching ``pattern`` has come for ``seconds``."""
    rx = re.compile(pattern)
    last = {"count": -1, "since": time.monotonic()}

    def check() -> bool:
        count = len(rx.findall(proc.text))
        if count != last["count"]:
            last.update(count=count, since=time.monotonic())
        return count > 0 and time.monotonic() - last["since"] >= seconds

    return check


@pytest.fixture
def cluster(transactional_db, tmp_path):
    redis = RedisServer().start()
    c = CeleryCluster(redis, tmp_path)
    yield c
    c.stop_all()
    c.report()
    redis.stop()


def test_sigterm_while_beat_publishes_a_task_exits_0_with_the_schedule_saved(cluster):
    with TcpProxy("127.0.0.1", cluster.redis.port) as proxy:
        beat = cluster.beat({"REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0"})
        broker = redis.Redis(port=cluster.redis.port)
        # The broker answers: a first task is in its queue ("Sending" is logged before that).
        wait_for(lambda: broker.llen("sluice") > 0, timeout=30, what="a first task in Redis")

        proxy.freeze()  # from now on the broker's replies never come
        # Beat sends a task every second; once one of its Redis calls waits for a reply that
        # never comes, its log goes quiet.  (A send logged just before the freeze may be the
        # one waiting, so no new line need follow it.)
        wait_for(quiet(beat, SENDING, seconds=2.5), timeout=30, interval=0.1, what="beat waiting on Redis")
        beat.sigterm()

        assert beat.terminate(timeout=30) == 0, beat.tail()
    assert "beat raised exception" not in beat.text, beat.tail()
    assert "closed" not in beat.text, beat.tail()  # no "I/O operation on closed file / shelf"
    assert list(cluster.tmp.glob("beat-0*")), "the schedule was not saved"
