"""Processes under faults: three ``sluice worker`` processes on one queue while a seeded
random schedule SIGKILLs and restarts them, terminates their PostgreSQL connections
(``pg_terminate_backend``) and stops and restarts their Redis (a private redis-server
on a free port).  Handlers (tests/fault_handlers.py) mix plans that succeed, send,
roll an inner block back, fail a few times, or always fail; their business rows go to
a ledger table.  Once the faults stop and the queue drains, the model test's
invariants must hold: every message handled exactly once or in the error queue exactly
once as its plan says, sends exactly when the business work committed, nothing left.

On SQLite the same without connection kills (there are no server connections to kill).
SLUICE_FAULT_SECONDS sets how long the faults go on (default 30).
"""
from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from core.messages import Headers
from core.transport import Transport
from tests.conftest import start_worker, start_workers, wait_for
from tests.model_checks import snapshot
from tests.model_support import EXCLUDED, create_ledger, drop_ledger

FAULT_SECONDS = float(os.environ.get("SLUICE_FAULT_SECONDS", "30"))
LIMIT = (2 + 1) * (1 + 1)  # SLUICE_IMMEDIATE_RETRIES=2, SLUICE_DELAYED_RETRIES=1 below
PLANS = [plan for plan in ["ok"] * 4 + ["slow"] * 2 + ["sends", "inner_rollback", "flaky1", "flaky2", "flaky4", "raise"]
         if plan not in EXCLUDED]  # SLUICE_MODEL_EXCLUDE, as in the model test
CHILDREN = {"sends": Counter({"c0": 1, "c1": 1}), "inner_rollback": Counter({"c1": 1})}


def fails_for_good(plan: str) -> bool:
    return plan == "raise" or plan.startswith("flaky") and int(plan[5:]) >= LIMIT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_redis(tmp_path: Path):
    """A redis-server of this test's own on a free loopback port; ``bounce()`` stops it
    and starts it again on the same port."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(tmp_path)]

    class Server:
        url = f"redis://127.0.0.1:{port}/0"
        proc = None

        def start(self) -> None:
            self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: _answers(port), timeout=10, what="the private redis-server")

        def stop(self) -> None:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                self.proc.wait(10)

        def bounce(self, down: float) -> None:
            self.stop()
            time.sleep(down)
            self.start()

    server = Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def worker_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return [row[0] for row in cursor.fetchall()]


def test_workers_under_sigkills_connection_kills_and_a_redis_outage_keep_every_guarantee(
        make_queue, error_queue, tmp_path):
    from core.scheduling import delayed_store

    delayed_store().setup_infrastructure()
    create_ledger()
    queue, out = make_queue("faults"), make_queue("faults_out")
    failures = tmp_path / "failures"
    failures.touch()
    seed = int(os.environ.get("SLUICE_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"fault schedule seed {seed} (SLUICE_FAULT_SEED={seed} replays the schedule)")
    transport = Transport()
    plans: dict[str, str] = {}

    def send(count: int) -> None:
        bodies = []
        for _ in range(count):
            key = f"f{len(plans)}"
            plans[key] = rng.choice(PLANS)
            bodies.append({"k": key, "b": plans[key]})
        transport.send_many(queue, bodies, message_type="Fault")

    kills = Counter()
    with private_redis(tmp_path) as redis:
        env = {"SLUICE_HANDLER_MODULES": "tests.fault_handlers", "FAULT_TEST_QUEUE": queue, "FAULT_TEST_OUT": out,
               "FAULT_TEST_FAILURES": str(failures), "REDIS_URL": redis.url, "SLUICE_IMMEDIATE_RETRIES": "2",
               "SLUICE_DELAYED_RETRIES": "1", "SLUICE_DELAYED_RETRY_INCREASE": "0.5",
               "SLUICE_MOVER_LEASE_SECONDS": "2", "SLUICE_RECEIVE_BATCH_SIZE": "20", "SLUICE_LOG_LEVEL": "ERROR"}
        # The error queue is where this test looks for messages that failed for good: the
        # periodic clean-ups (error ingestion) are left to beat, as in a Celery deployment.
        args = ("--queue", queue, "--concurrency", "2", "--no-maintenance")
        send(300)
        workers = start_workers(3, *args, env=env)
        try:
            deadline = time.monotonic() + FAULT_SECONDS
            bounced = False
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.3, 1.5))
                send(rng.randrange(10, 40))
                action = rng.choice(["sigkill", "pg_kill", "pg_kill", "redis" if not bounced else "pg_kill"])
                if action == "pg_kill" and connection.vendor != "postgresql":
                    action = "none"  # SQLite: no connections to kill; a quiet interval instead
                if action == "sigkill":
                    victim = rng.randrange(len(workers))
                    workers[victim].send_signal(signal.SIGKILL)
                    workers[victim].wait(10)
                    workers[victim] = start_worker(*args, env=env)
                elif action == "pg_kill":
                    backends = worker_backends()
                    for pid in rng.sample(backends, min(len(backends), rng.randrange(1, 4))):
                        with connection.cursor() as cursor:
                            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                elif action == "redis":
                    redis.bounce(down=2.0)
                    bounced = True
                kills[action] += 1
            print(f"faults: {dict(kills)}; {len(plans)} messages")
            store = delayed_store()
            wait_for(lambda: transport.counts(queue).total == 0 and not any(
                m.destination == queue for m in store.list(10_000)[0]), timeout=180, interval=0.5,
                what="the queue and the delayed store drained after the faults")
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(30)
                except subprocess.TimeoutExpired:
                    w.kill()
    try:
        _check(plans, snapshot(queue, out), Counter(failures.read_text().split()))
    finally:
        drop_ledger()


def _check(plans: dict[str, str], snap, failed_runs: Counter) -> None:
    found = []
    for key, plan in plans.items():
        handled, errored = snap.ledger.get(key, []), snap.errors.get(key, [])
        if fails_for_good(plan):
            if handled or len(errored) != 1:
                found.append(f"{key} ({plan}): handled {len(handled)}, in the error queue {len(errored)} time(s)")
            for headers in errored:
                if headers.get(Headers.TOTAL_FAILED_ATTEMPTS) != str(LIMIT) or not headers.get(Headers.EXCEPTION_TYPE):
                    found.append(f"{key} ({plan}): error-queue headers {headers}")
            continue
        if len(handled) != 1 or errored:
            found.append(f"{key} ({plan}): handled {len(handled)} time(s), in the error queue {len(errored)}")
            continue
        if handled[0] > failed_runs[key]:
            found.append(f"{key} ({plan}): {handled[0]} failed attempts counted, {failed_runs[key]} failed runs")
        want = CHILDREN.get(plan, Counter())
        if snap.children.get(key, Counter()) != want:
            found.append(f"{key} ({plan}): sends {dict(snap.children.get(key, {}))}, expected {dict(want)}")
    extra = sum(failed_runs.values()) - sum(min(failed_runs[k], LIMIT) for k in failed_runs)
    print(f"failed handler runs {sum(failed_runs.values())} (beyond the retry limit: {extra})")
    assert not found, f"{len(found)} violation(s):\n  " + "\n  ".join(found[:30])
