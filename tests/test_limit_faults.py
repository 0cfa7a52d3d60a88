"""Queue limits under faults: three ``sluice worker`` processes (three threads each) on a
queue limited to 2 messages at once and 40 a second (SLUICE_QUEUE_LIMITS, from the
environment), under a steady load, while a seeded schedule SIGKILLs a worker in the middle
of a handler and starts it again.  Counted by the handlers themselves (tests/limit_handlers.py):

- nothing lost, nothing doubled: every message's work committed exactly once;
- never more than 2 handlers running at once, killed runs included (a killed run ends,
  for this count, when the signal is sent: its slot can come back no sooner, as the
  database frees it only once the process is gone and its connection with it);
- never more than 40 committed handler starts in any second (tickets are marked by the
  database's clock, the starts by the handlers': the same host's clock, SQLite's to the
  millisecond, so 1 ms of slack).

On SQLite the receives of every process take turns for the one write lock, so no more
than one handler runs at once; the test shows the limits hold there too.
SLUICE_FAULT_SECONDS sets how long the kills go on (default 20).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter

from django.db import connection

from core.transport import Transport
from tests.conftest import start_worker, start_workers, wait_for
from tests.limit_handlers import LEDGER
from tests.test_queue_limits import most_in_a_second

FAULT_SECONDS = float(os.environ.get("SLUICE_FAULT_SECONDS", "20"))
CONCURRENCY, RATE = 2, 40


def runs(log_text: str, kills: dict[int, float]) -> list[tuple[float, float]]:
    """Every handler run as (start, end); a run with no end was killed: it ends at its
    process's kill."""
    open_runs: dict[tuple[str, int], float] = {}
    found = []
    for line in log_text.splitlines():
        what, key, pid, at = line.split()
        if what == "start":
            open_runs[(key, int(pid))] = float(at)
        else:
            found.append((open_runs.pop((key, int(pid))), float(at)))
    for (key, pid), start in open_runs.items():
        assert pid in kills, f"run of {key} in process {pid} never ended, and that process was not killed"
        found.append((start, kills[pid]))
    return found


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])  # an end first at a tie
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_sigkilled_workers_lose_and_double_nothing_and_never_exceed_the_limits(make_queue, tmp_path):
    queue = make_queue("limited")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {LEDGER}")
        cursor.execute(f"CREATE TABLE {LEDGER} (k varchar(64) NOT NULL, pid integer NOT NULL, started float NOT NULL)")
    log = tmp_path / "runs"
    log.touch()
    seed = int(os.environ.get("SLUICE_FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"limits fault seed {seed} (SLUICE_FAULT_SEED={seed} replays the schedule)")
    transport = Transport()
    sent = 0

    def send(count: int) -> None:
        nonlocal sent
        transport.send_many(queue, [{"k": f"m{sent + n}"} for n in range(count)], message_type="Limited")
        sent += count

    env = {"SLUICE_HANDLER_MODULES": "tests.limit_handlers", "LIMIT_TEST_QUEUE": queue, "LIMIT_TEST_LOG": str(log),
           "SLUICE_QUEUE_LIMITS": f'{{"{queue}": {{"concurrency": {CONCURRENCY}, "rate": {RATE}}}}}',
           "SLUICE_RECEIVE_BATCH_SIZE": "3", "SLUICE_LOG_LEVEL": "ERROR"}
    args = ("--queue", queue, "--concurrency", "3", "--no-maintenance", "--no-mover")
    kills: dict[int, float] = {}
    mid_handler = 0
    send(200)
    workers = start_workers(3, *args, env=env)
    try:
        deadline = time.monotonic() + FAULT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 1.2))
            send(rng.randrange(10, 30))
            for _ in range(100):  # a worker in the middle of a handler: its last start has no end yet
                busy = [i for i, w in enumerate(workers) if w.pid in _running(log.read_text())]
                if busy:
                    break
                time.sleep(0.005)
            victim = rng.choice(busy) if busy else rng.randrange(len(workers))
            mid_handler += bool(busy)
            kills[workers[victim].pid] = time.time()  # before the signal: the run ends no later
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            workers[victim] = start_worker(*args, env=env)
        wait_for(lambda: transport.counts(queue).total == 0, timeout=120, interval=0.5,
                 what="the queue drained after the kills")
        time.sleep(0.5)  # the last batches commit
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT k, started FROM {LEDGER}")
            ledger = cursor.fetchall()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {LEDGER}")
    spans = runs(log.read_text(), kills)
    print(f"{len(kills)} kills ({mid_handler} mid-handler), {sent} messages, {len(spans)} handler runs, "
          f"at once at most {most_at_once(spans)}, committed starts per second at most "
          f"{most_in_a_second([started for _, started in ledger])}")
    done = Counter(key for key, _ in ledger)
    assert sorted(done) == sorted(f"m{n}" for n in range(sent)), "lost messages"
    assert [key for key, n in done.items() if n > 1] == [], "doubled messages"
    assert mid_handler >= len(kills) // 2, "too few kills hit a running handler to prove anything"
    assert most_at_once(spans) <= (CONCURRENCY if connection.vendor != "sqlite" else 1)
    assert most_in_a_second([started for _, started in ledger]) <= RATE


def _running(text: str) -> set[int]:
    """Processes with a handler run started and not ended."""
    open_runs: set[tuple[str, str]] = set()
    for line in text.splitlines():
        what, key, pid, _ = line.split()
        (open_runs.add if what == "start" else open_runs.discard)((key, pid))
    return {int(pid) for _, pid in open_runs}
