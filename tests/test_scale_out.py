"""Several worker processes on one queue: every message handled exactly once."""
from __future__ import annotations

import signal

import pytest

from core.conf import get_settings
from core.demo.models import PingRecord
from core.messages import Headers
from core.transport import Transport
from tests.conftest import start_worker, start_workers, wait_for


@pytest.mark.row_locking
def test_two_worker_processes_never_receive_the_same_message(demo):
    transport = Transport()
    # Slow messages keep both workers busy long enough for both to take part.
    transport.send_many("demo", [{"seconds": 0.01} for _ in range(300)], message_type="Slow")
    ids = transport.send_many("demo", [{"n": i} for i in range(600)], message_type="Ping")
    workers = start_workers(2, "--queue", "demo", "--concurrency", "3")
    try:
        wait_for(lambda: PingRecord.objects.count() >= 600, timeout=120, what="600 pings handled")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            assert w.wait(30) == 0
    handled = list(PingRecord.objects.values_list("message_id", flat=True))
    assert len(handled) == 600 and sorted(handled) == sorted(ids)
    # Both processes took part (otherwise this proves nothing about concurrency).
    counts = [int(line.split("received ")[1].split(",")[0])
              for w in workers for line in w.output if line.startswith("demo: received")]
    assert len(counts) == 2 and all(c > 0 for c in counts) and sum(counts) == 900


def test_a_killed_worker_loses_nothing(demo):
    """SIGKILL mid-batch: the open receive transaction rolls back, a new worker finishes."""
    transport = Transport()
    ids = transport.send_many("demo", [{"seconds": 0.05} for _ in range(40)], message_type="Slow")
    ping_ids = transport.send_many("demo", [{} for _ in range(20)], message_type="Ping")
    first = start_worker("--queue", "demo", "--concurrency", "2")
    wait_for(lambda: transport.counts("demo").total < 55, what="first worker busy")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    second = start_worker("--queue", "demo", "--until-empty")
    assert second.wait(120) == 0
    assert transport.counts("demo").total == 0
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(ping_ids)
    # The Slow messages the killed worker held came back and were handled, not failed:
    # none of them reached the error queue.
    failed = {m.headers.get(Headers.MESSAGE_ID) for m in transport.browse(get_settings().ERROR_QUEUE, limit=1000)}
    assert not failed & set(ids)
