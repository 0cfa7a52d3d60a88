"""The outbox's Celery destination, with a real Redis broker and a real Celery worker.

The worker runs ``sluice.record_ping`` (one row in sluice_demo_ping per run), so a row
proves a task was published.  Everything that publishes runs in a child process with
REDIS_URL on a Redis database of its own, on a Celery queue of its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest

from core.demo.models import PingRecord
from core.queues import create_queue
from core.transport import Transport
from tests.conftest import ROOT, database_url, manage, wait_for
from tests.outbox_celery_handlers import QUEUE as RELAY_QUEUE

REDIS_URL = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/9")


def redis_up() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


pytestmark = pytest.mark.skipif(not redis_up(), reason=f"needs Redis at {REDIS_URL}")


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": REDIS_URL, "PYTHONUNBUFFERED": "1",
            **extra}


@pytest.fixture
def celery_queue(outbox):
    """A real Celery worker (threads pool) consuming a queue of its own; yields the queue."""
    name = f"sluice-outbox-test-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "worker", "--pool=threads", "-c", "2", "-Q", name,
         "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO"],
        # A task-only worker: the loops (pumps, mover) are not what this test is about.
        cwd=ROOT, env=child_env(SLUICE_CELERY_HOST_LOOPS="0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for raw in proc.stdout:
            output.append(raw.decode(errors="replace"))
            if " ready." in output[-1]:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(60):
            raise AssertionError("Celery worker did not start:\n" + "".join(output))
        yield name
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def session_script(ping: str, celery_queue: str, fail: bool = False, kill_at: str = "") -> str:
    """What a view would do: a business write and a task, in one transaction.  ``kill_at``:
    the process dies at that point of the outbox (tests/outbox_faults.py)."""
    prelude = f"from tests.outbox_faults import install\ninstall({kill_at!r})\n" if kill_at else ""
    return prelude + (
        "from django.db import transaction\n"
        "from core.demo.models import PingRecord\n"
        "from core.outbox import OutboxSession\n"
        "from workers.outbox import send_task_via_outbox\n"
        "with transaction.atomic(), OutboxSession() as session:\n"
        f"    PingRecord.objects.create(message_id={'view-' + ping!r})\n"
        f"    send_task_via_outbox(session, 'sluice.record_ping', args=[{ping!r}], queue={celery_queue!r})\n"
        f"    if {fail!r}: raise SystemExit(3)\n"
    )


def pings(message_id: str) -> int:
    return PingRecord.objects.filter(message_id=message_id).count()


def assert_never_published(ping: str, celery_queue: str) -> None:
    """A task published after ``ping`` would have been, on the same queue, has run; ``ping`` has not."""
    marker = f"marker-after-{ping}"
    manage("shell", "-c", session_script(marker, celery_queue), env=child_env(), check=True)
    wait_for(lambda: pings(marker) == 1, timeout=30, what="the marker task to run")
    assert pings(ping) == 0


def test_a_task_is_published_only_when_the_transaction_commits(celery_queue):
    manage("shell", "-c", session_script("committed", celery_queue), env=child_env(), check=True)
    wait_for(lambda: pings("committed") == 1, timeout=30, what="the task to run")
    assert pings("view-committed") == 1

    result = manage("shell", "-c", session_script("rolled-back", celery_queue, fail=True), env=child_env())
    assert result.returncode == 3
    assert pings("view-rolled-back") == 0
    assert_never_published("rolled-back", celery_queue)


def test_a_task_survives_a_process_killed_after_the_commit(celery_queue, outbox):
    result = manage("shell", "-c", session_script("survivor", celery_queue, kill_at="after_commit"),
                    env=child_env())
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    assert pings("view-survivor") == 1  # committed
    assert outbox.store.stats().undispatched == 1
    assert_never_published("survivor", celery_queue)  # the process died before phase 2

    # Any worker process's background dispatcher publishes it.
    create_queue("error")
    worker = manage("sluice", "worker", "--queue", "error", "--until-empty", timeout=60,
                    env=child_env(SLUICE_OUTBOX_DISPATCHER_INTERVAL="0.2", SLUICE_OUTBOX_DISPATCHER_GRACE="0"))
    assert worker.returncode == 0, worker.stderr.decode()
    wait_for(lambda: pings("survivor") == 1, timeout=30, what="the task to run")
    assert outbox.store.stats().undispatched == 0


def test_a_handler_in_outbox_mode_publishes_tasks_after_its_commit(celery_queue, outbox):
    create_queue(RELAY_QUEUE)
    Transport().purge(RELAY_QUEUE)
    Transport().send(RELAY_QUEUE, {"ping": "from-handler", "celery_queue": celery_queue})
    worker = manage("sluice", "worker", "--queue", RELAY_QUEUE, "--until-empty", timeout=60,
                    env=child_env(SLUICE_TRANSACTION_MODE="outbox",
                                  SLUICE_HANDLER_MODULES="core.demo.handlers,tests.outbox_celery_handlers"))
    assert worker.returncode == 0, worker.stderr.decode()
    wait_for(lambda: pings("from-handler") == 1, timeout=30, what="the task to run")
    assert outbox.store.stats().records == 1 and outbox.store.stats().undispatched == 0
