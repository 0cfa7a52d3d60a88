"""Worker health in Redis: `sluice status` sees workers, loops and breakers; Redis down
never stops message processing."""
from __future__ import annotations

import json
import signal

from core.demo.models import PingRecord
from core.transport import Transport
from tests.conftest import manage, start_worker, wait_for

REDIS = "redis://127.0.0.1:6379/14"  # a database of its own: other workers publish elsewhere
NO_REDIS = "redis://127.0.0.1:1/0"   # nothing listens there


def status(redis_url: str) -> dict:
    result = manage("sluice", "status", "--json", env={"REDIS_URL": redis_url})
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_status_shows_a_running_worker_and_forgets_it_when_it_stops(demo):
    worker = start_worker("--queue", "demo", env={"REDIS_URL": REDIS})
    try:
        seen = wait_for(lambda: [w for w in status(REDIS)["workers"] if w["name"].endswith(f":{worker.pid}")],
                        timeout=20, what="worker heartbeat")[0]
        assert status(REDIS)["redis"] == "up"
        loops = {loop["name"]: loop for loop in seen["loops"]}
        assert {"pump:demo", "health"} <= set(loops) and any(n.startswith("delayed-mover") for n in loops)
        assert all(loop["alive"] for loop in loops.values())
        breakers = {b["name"]: b["state"] for b in seen["breakers"]}
        assert breakers["pump-receive:demo"] == "closed"
        assert {"last_seen", "loops", "breakers", "name"} <= set(seen)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert not [w for w in status(REDIS)["workers"] if w["name"].endswith(f":{worker.pid}")]


def test_with_redis_down_messages_still_flow_and_status_says_so(demo):
    worker = start_worker("--queue", "demo", env={"REDIS_URL": NO_REDIS})
    try:
        ids = [Transport().send("demo", {}, message_type="Ping") for _ in range(3)]
        wait_for(lambda: PingRecord.objects.count() == 3, what="pings handled without Redis")
        # The health loop says so at its first step, which may come after the pump's on a
        # busy machine: waited for, so the stop cannot come before that step.
        wait_for(lambda: "cannot publish health to Redis" in "".join(worker.output), what="the health loop's warning")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(ids)
    assert status(NO_REDIS)["redis"] == "down"


def test_a_heartbeat_taken_while_the_worker_starts_shows_no_loop_as_dead():
    """The health loop's first step waits until every loop's thread has started: a heartbeat
    published then would make `sluice status --check` fail a worker that is fine."""
    import threading
    import time

    from core.runtime.loops import ThreadRunner

    seen: list[list[dict]] = []
    first_step = threading.Event()

    class Snapshotting:  # like the health loop: it reports the runner's loops
        name = "health"

        def step(self) -> float:
            if not seen:
                seen.append(runner.snapshot())
                first_step.set()
            return 0.05

        def close(self) -> None:
            pass

    class SlowToStart:  # a loop whose set-up before its thread starts takes a while
        name = "pump:slow"

        def bind_wake(self, wake) -> None:
            time.sleep(0.3)

        def step(self) -> float:
            return 0.05

        def close(self) -> None:
            pass

    runner = ThreadRunner([Snapshotting(), SlowToStart()])
    with runner:
        assert first_step.wait(5)
    assert {loop["name"]: loop["alive"] for loop in seen[0]} == {"health": True, "pump:slow": True}
