"""``python -m benchmarks tasks``: Django tasks end to end through Sluice's backend, beside
django-tasks-db (the framework's ORM reference backend, with its own ``db_worker``) and
Sluice's own messages, in one run on one database.

Each phase starts its worker, waits until a probe has run (a warm worker), then enqueues
N no-op tasks one ``enqueue()`` each, ``--per-transaction`` to a transaction, and
times first enqueue → the last one finished (the task queue empty, polled every 50 ms as
the message phase polls its queue; then every result must be SUCCESSFUL).  The message
phase sends N messages one ``Transport.send()`` each to a no-op handler and times first
send → the queue empty.  One worker process each, with its
defaults (Sluice: ``sluice worker``; django-tasks-db: ``db_worker``, one task at a time,
polling every second).  django-tasks-db runs in a project of its own
(benchmarks/tasks_peer_settings.py) in a subprocess (``--peer`` mode of this module).

The JSON line: ``sluice_e2e_per_s``, ``django_tasks_db_e2e_per_s``, ``message_e2e_per_s``
and their ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

from benchmarks.common import (REPO_ROOT, BenchmarkError, Worker, add_database_argument, bench_database, log,
                               positive_int, rate, standard_main, worker_env)

HELP = "Django tasks end to end: Sluice's backend vs django-tasks-db's db_worker vs Sluice messages"
SLUICE_SETTINGS = "benchmarks.tasks_settings"
PEER_SETTINGS = "benchmarks.tasks_peer_settings"
POLL = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--tasks", type=positive_int, default=20000, metavar="N",
                        help="tasks (and messages) per phase (default 20000)")
    parser.add_argument("--per-transaction", type=positive_int, default=100, metavar="K",
                        help="enqueue() calls per transaction, the same for every phase (default 100, as a "
                             "request or handler that enqueues many does; 1: each in autocommit)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="give up on a phase after S seconds (default: 60 + N/10)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("tasks", HELP, add_arguments, run, argv)


def wait_until(done: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``done`` until true; the perf_counter instant it was seen true."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL)
    return time.perf_counter()


def enqueue_and_wait(enqueue: Callable[[int], Any], unfinished: Callable[[], int], n: int, timeout: float,
                     label: str, per_transaction: int) -> float:
    """Enqueue ``n`` one by one, ``per_transaction`` to a transaction (1: autocommit each),
    wait until none is unfinished; seconds first enqueue → done."""
    from django.db import transaction

    started = time.perf_counter()
    for first in range(0, n, per_transaction):
        if per_transaction == 1:
            enqueue(first)
            continue
        with transaction.atomic():
            for i in range(first, min(first + per_transaction, n)):
                enqueue(i)
    enqueued = time.perf_counter()
    done = wait_until(lambda: unfinished() == 0, timeout, f"{label} to finish")
    log(f"{label}: {n} enqueued in {enqueued - started:.2f} s, all done after {done - started:.2f} s "
        f"= {n / (done - started):.0f}/s")
    return done - started


# -- Sluice: tasks and messages, in this process (the workers are subprocesses) ------------------
def sluice_phases(url: str, n: int, timeout: float, per_transaction: int) -> dict[str, float]:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = SLUICE_SETTINGS
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    from benchmarks.tasks_app import noop
    from benchmarks.tasks_handlers import MESSAGE_QUEUE
    from core.models import TaskResultRecord
    from core.queues import create_queue
    from core.setup import setup_infrastructure
    from core.transport import Transport

    setup_infrastructure()
    create_queue(MESSAGE_QUEUE)
    transport = Transport()
    queue = noop.get_backend().sluice_queue(noop.queue_name)
    env = worker_env(url, {"DJANGO_SETTINGS_MODULE": SLUICE_SETTINGS,
                           "SLUICE_HANDLER_MODULES": "benchmarks.tasks_handlers", "SLUICE_LOG_LEVEL": "WARNING"})
    with Worker(["--queue", queue, "--queue", MESSAGE_QUEUE], env, "sluice worker") as worker:
        worker.wait_ready(120)
        probe = noop.enqueue(-1)
        wait_until(lambda: noop.get_result(probe.id).is_finished, 60, "the probe task")
        # Done when the task queue is empty, polled as the message phase polls its queue: a
        # task's message leaves the queue in the transaction that writes its outcome, so an
        # empty queue means every result is written.  (Counting unfinished results instead
        # scanned the whole result table every poll: the database's CPU for the benchmark's
        # own look, in this phase only.)  Then every result must be SUCCESSFUL.
        task_s = enqueue_and_wait(noop.enqueue, lambda: transport.counts(queue).total, n, timeout, "sluice tasks",
                                  per_transaction)
        unsuccessful = TaskResultRecord.objects.exclude(status="SUCCESSFUL").count()
        if unsuccessful:
            raise BenchmarkError(f"{unsuccessful} Sluice task(s) not SUCCESSFUL")
        message_s = enqueue_and_wait(lambda i: transport.send(MESSAGE_QUEUE, {"i": i}, message_type="Noop"),
                                     lambda: transport.counts(MESSAGE_QUEUE).total, n, timeout, "sluice messages",
                                     per_transaction)
    return {"sluice_e2e_s": task_s, "message_e2e_s": message_s}


# -- django-tasks-db: its own project, in a subprocess ----------------------------------------------
def peer_phase(url: str, n: int, timeout: float, per_transaction: int) -> dict[str, float]:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": PEER_SETTINGS, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.tasks", "--peer", str(n), str(timeout), str(per_transaction)], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, text=True, timeout=timeout + 300)
    if done.returncode != 0:
        raise BenchmarkError(f"the django-tasks-db phase failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_peer(n: int, timeout: float, per_transaction: int) -> None:
    """``--peer``: in the django-tasks-db project, migrate, start ``db_worker``, enqueue, wait."""
    import django

    django.setup()
    from django.core.management import call_command
    from django_tasks_db.models import DBTaskResult

    from benchmarks.tasks_app import noop

    call_command("migrate", verbosity=0)
    worker = subprocess.Popen([sys.executable, "-m", "django", "db_worker", "--verbosity", "0"], cwd=REPO_ROOT,
                              env=dict(os.environ), stdin=subprocess.DEVNULL)
    try:
        probe = noop.enqueue(-1)
        wait_until(lambda: noop.get_result(probe.id).is_finished, 60, "the probe task")
        unfinished = DBTaskResult.objects.filter(status__in=["READY", "RUNNING"])
        seconds = enqueue_and_wait(noop.enqueue, unfinished.count, n, timeout, "django-tasks-db tasks",
                                   per_transaction)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    print(json.dumps({"django_tasks_db_e2e_s": seconds}))


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.tasks
    timeout = args.timeout or 60 + n / 10
    with bench_database(args.db, name="sluice_bench_tasks") as url:
        sluice = sluice_phases(url, n, timeout, args.per_transaction)
        peer = peer_phase(url, n, timeout, args.per_transaction)
    from django.db import connection

    sluice_rate, peer_rate = rate(n, sluice["sluice_e2e_s"]), rate(n, peer["django_tasks_db_e2e_s"])
    message_rate = rate(n, sluice["message_e2e_s"])
    return {
        "benchmark": "tasks",
        "sluice_e2e_per_s": sluice_rate,
        "django_tasks_db_e2e_per_s": peer_rate,
        "message_e2e_per_s": message_rate,
        "tasks": n,
        "per_transaction": args.per_transaction,
        "db": connection.vendor,
        "sluice_vs_django_tasks_db": sluice_rate / peer_rate if sluice_rate and peer_rate else None,
        "sluice_vs_messages": sluice_rate / message_rate if sluice_rate and message_rate else None,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peer"]:
        run_peer(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(main(sys.argv[1:]))
