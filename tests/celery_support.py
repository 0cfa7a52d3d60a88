"""Helpers for tests that run real Celery workers (tests/test_celery_workers.py).

- :class:`RedisServer`: a private ``redis-server`` on a free port (stop / restart it
  without disturbing anybody else's Redis).
- :class:`Proc`: a child process whose merged stdout/stderr is read continuously by a
  thread (a full pipe would block a worker), with ``wait_line()`` and log parsers.
- :class:`CeleryCluster`: starts ``celery -A workers worker|beat`` against the test
  database and the private Redis; :meth:`CeleryCluster.stop_all` kills stragglers.
- Database-side helpers: ping ids, queue contents, the delayed store.
"""
from __future__ import annotations

import ast
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connections

from tests.conftest import ROOT, database_url, manage, wait_for

#: Environment every Celery process of these tests gets (short intervals, quick hand-overs).
DEFAULT_ENV = {
    "PYTHONUNBUFFERED": "1",
    "SLUICE_LOG_LEVEL": "INFO",
    "SLUICE_PURGE_INTERVAL": "1",
    "SLUICE_INGEST_INTERVAL": "1",
    "SLUICE_IDLE_QUEUE_INTERVAL": "5",
    "SLUICE_ARCHIVE_PURGE_INTERVAL": "60",
    "SLUICE_PEEK_DELAY": "0.2",
    # A killed mover's lease lapses after 3 s (the default 10 s would only slow the tests).
    "SLUICE_MOVER_LEASE_SECONDS": "3",
    # A periodic task's lease is 3 × the budget: a killed purge blocks others for 9 s.
    "SLUICE_TASK_TIME_BUDGET": "3",
    "SLUICE_DEMO_TRAFFIC": "0",
}


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies, so a
    killed pytest (no teardown) leaves no worker or Redis behind.  Linux only; best effort."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- Redis -------------------------------------------------------------------------------------

class RedisServer:
    """``redis-server`` on 127.0.0.1:<free port>, no persistence, in the foreground."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        # No retries: redis-py's default (3, with backoff) would make a "no" take seconds.
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5,
                             retry=Retry(NoBackoff(), 0))
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def start(self, timeout: float = 15) -> "RedisServer":
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server on port {self.port} exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise AssertionError(f"redis-server on port {self.port} did not answer within {timeout} s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        wait_for(lambda: not self.ping(), timeout=10, what=f"redis on port {self.port} to stop answering")


# -- child processes ---------------------------------------------------------------------------

CELERY_LOG = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): (?P<level>[A-Z]+)/[^\]]*\] (?P<msg>.*)$")
TASK_DONE = re.compile(r"^Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]+)\] succeeded in (?P<runtime>[0-9.e-]+)s: "
                       r"(?P<result>.*)$")
SUMMARY = re.compile(r"sluice\.celery: (?P<queue>[\w.-]+): received (?P<received>\d+), handled (?P<handled>\d+), "
                     r"retried (?P<retried>\d+), to error (?P<errored>\d+), expired (?P<expired>\d+), "
                     r"poison (?P<poison>\d+)")
#: Lines that mean something went wrong (Python logging and Celery's own format).
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")


@dataclass
class TaskRun:
    """One task execution, from Celery's "Task … succeeded in …" line."""

    worker: str
    name: str
    id: str
    started: float  # epoch seconds (log time of the end − runtime)
    ended: float
    result: Any


class Proc:
    """A child process; its output is read into :attr:`lines` as it comes."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> None:
        self.name = name
        self.argv = argv
        self.popen = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_die_with_parent)
        self.pid = self.popen.pid
        self.lines: list[str] = []
        self._eof = False
        self._termed = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    # -- looking ------------------------------------------------------------------------------
    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def tail(self, n: int = 80) -> str:
        with self._cond:
            return "\n".join(self.lines[-n:])

    def wait_line(self, pattern: str, timeout: float = 60, start: int = 0) -> re.Match:
        """The first line from ``start`` on matching ``pattern`` (waits for it)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        i = start
        with self._cond:
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                if self._eof:
                    raise AssertionError(f"{self.name} exited ({self.popen.poll()}) before printing {pattern!r}:\n"
                                         f"{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no line matching {pattern!r} within {timeout} s:\n"
                                         f"{self.tail()}")
                self._cond.wait(min(left, 0.2))

    def mark(self) -> int:
        """A position in the output (for ``wait_line(start=…)``)."""
        with self._cond:
            return len(self.lines)

    def count(self, pattern: str) -> int:
        rx = re.compile(pattern)
        with self._cond:
            return sum(1 for line in self.lines if rx.search(line))

    def error_lines(self, allow: tuple[str, ...] = ()) -> list[str]:
        with self._cond:
            return [line for line in self.lines
                    if ERROR_LINE.search(line) and not any(re.search(a, line) for a in allow)]

    def summaries(self) -> dict[str, dict[str, int]]:
        """The per-pump lines a stopping worker logs: {queue: {received, handled, …}}."""
        out = {}
        with self._cond:
            for line in self.lines:
                m = SUMMARY.search(line)
                if m:
                    out[m["queue"]] = {k: int(v) for k, v in m.groupdict().items() if k != "queue"}
        return out

    def task_runs(self, name: str | None = None) -> list[TaskRun]:
        runs = []
        with self._cond:
            lines = list(self.lines)
        for line in lines:
            m = CELERY_LOG.match(line)
            if not m:
                continue
            t = TASK_DONE.match(m["msg"])
            if not t or (name and t["name"] != name):
                continue
            ended = dt.datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            try:
                result = ast.literal_eval(t["result"])
            except (ValueError, SyntaxError):
                result = t["result"]
            runs.append(TaskRun(self.name, t["name"], t["id"], ended - float(t["runtime"]), ended, result))
        return runs

    # -- stopping -----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def _join_reader(self) -> None:
        self._reader.join(10)

    def sigterm(self) -> None:
        """One SIGTERM (Celery: warm shutdown; a second signal would not be the same)."""
        if self.alive and not self._termed:
            self._termed = True
            self.popen.send_signal(signal.SIGTERM)

    def terminate(self, timeout: float = 45) -> int:
        """SIGTERM (unless sent already) and wait; the exit code."""
        self.sigterm()
        code = self.popen.wait(timeout)
        self._join_reader()
        return code

    def kill(self) -> int:
        """SIGKILL: no clean-up of any kind."""
        if self.alive:
            self.popen.send_signal(signal.SIGKILL)
        code = self.popen.wait(15)
        self._join_reader()
        return code

    def stop(self, grace: float = 20) -> None:
        """Teardown: SIGTERM, then SIGKILL if it does not go."""
        if self.alive:
            self.sigterm()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(15)
        self._join_reader()


class CeleryCluster:
    """Celery workers and beat against the test database and a private Redis."""

    def __init__(self, redis: RedisServer, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.redis = redis
        self.tmp = tmp
        self.extra_env = dict(env or {})
        self.procs: list[Proc] = []
        self._clients: list[Any] = []

    def env(self, extra: dict[str, str] | None = None, database: str | None = None) -> dict[str, str]:
        return {**os.environ, **DEFAULT_ENV, "DATABASE_URL": database or database_url(), "REDIS_URL": self.redis.url,
                **self.extra_env, **(extra or {})}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, env)
        self.procs.append(proc)
        return proc

    def workers(self, count: int, env: dict[str, str] | None = None, *, database: str | None = None,
                first: int = 0, timeout: float = 60) -> list["Proc"]:
        """Start ``count`` workers together; return once each has started its loops and is ready."""
        procs = []
        for i in range(first, first + count):
            name = f"w{i}-{len(self.procs)}"
            argv = [sys.executable, "-m", "celery", "-A", "workers", "worker", "--pool=threads", "-c", "2",
                    "--loglevel=info", "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
            procs.append(self._spawn(name, argv, self.env(env, database)))
        for proc in procs:
            proc.wait_line(r"Sluice loops started|SLUICE_CELERY_HOST_LOOPS is off", timeout)
            proc.wait_line(r"@\S+ ready\.", timeout)
        return procs

    def worker(self, env: dict[str, str] | None = None, **kw: Any) -> Proc:
        return self.workers(1, env, **kw)[0]

    def beat(self, env: dict[str, str] | None = None, timeout: float = 60) -> Proc:
        schedule = self.tmp / f"beat-{len(self.procs)}"
        argv = [sys.executable, "-m", "celery", "-A", "workers", "beat", "-s", str(schedule), "--loglevel=info"]
        proc = self._spawn("beat", argv, self.env(env))
        proc.wait_line(r"beat: Starting", timeout)
        return proc

    def client(self):
        """A Celery app that talks to the workers (send_task + results), not a worker itself."""
        from celery import Celery

        app = Celery("sluice-tests", broker=self.redis.url, backend=self.redis.url)
        app.conf.update(task_default_queue="sluice", broker_connection_retry_on_startup=True)
        self._clients.append(app)
        return app

    # -- health (what `sluice status --json` says) --------------------------------------------------
    def status(self) -> dict:
        result = manage("sluice", "status", "--json", env={"REDIS_URL": self.redis.url})
        assert result.returncode == 0, result.stderr.decode()
        return json.loads(result.stdout)

    def heartbeat(self, proc: Proc) -> dict | None:
        """This worker's entry in `sluice status --json`, or None."""
        return next((w for w in self.status()["workers"] if w["name"].endswith(f":{proc.pid}")), None)

    def stop_all(self) -> None:
        for app in self._clients:
            try:
                app.close()
            except Exception:  # noqa: BLE001
                pass
        for proc in reversed(self.procs):
            proc.stop()

    def report(self) -> None:
        """Each process's output into ``<tmp>/<name>.log`` and its tail printed (pytest shows
        what a failed test printed)."""
        for proc in self.procs:
            log = self.tmp / f"{proc.name}.log"
            log.write_text(proc.text)
            print(f"\n===== {proc.name} (pid {proc.pid}, exit {proc.popen.returncode}; all of it in {log}) =====\n"
                  f"{proc.tail(150)}")


def all_task_runs(procs: list[Proc], name: str) -> list[TaskRun]:
    return sorted((run for p in procs for run in p.task_runs(name)), key=lambda r: r.started)


def overlapping(runs: list[TaskRun], tolerance: float = 0.05) -> list[tuple[TaskRun, TaskRun]]:
    """Pairs of runs whose [start, end] intervals overlap by more than ``tolerance`` seconds
    (log times have ms resolution and are taken just after a task returns)."""
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            if min(a.ended, b.ended) - max(a.started, b.started) > tolerance:
                pairs.append((a, b))
    return pairs


# -- the database, seen from the test process -------------------------------------------------------

def one_snapshot(*reads):
    """Each read's answer, all from one snapshot of the database (PostgreSQL: a repeatable-read
    transaction; SQLite: one read transaction), so no commit lands between them."""
    from django.db import connection, transaction

    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return [read() for read in reads]


def ping_ids() -> list[str]:
    from core.demo.models import PingRecord

    return list(PingRecord.objects.values_list("message_id", flat=True))


def queue_ids(queue: str) -> list[str]:
    """Message ids of every row in ``queue`` (FIFO order, not taken)."""
    from core.messages import Headers
    from core.transport import Transport

    t = Transport()
    ids, after = [], 0
    while True:
        page = t.browse(queue, limit=500, after=after)
        if not page:
            return ids
        ids += [m.headers.get(Headers.MESSAGE_ID, m.id) for m in page]
        after = page[-1].row_version


def _store():
    from core.delayed import SqlDelayedStore

    return SqlDelayedStore()


def delayed_count() -> int:
    store = _store()
    with connections[store.using].cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {store.dialect.table(store.table)}")
        return int(cursor.fetchone()[0])


def delayed_ids() -> list[str]:
    messages, _ = _store().list(limit=100_000)
    return [m.id for m in messages]


def clear_delayed() -> None:
    """The delayed store is not a Django table: a test database flush leaves it alone."""
    store = _store()
    with connections[store.using].cursor() as cursor:
        cursor.execute(f"DELETE FROM {store.dialect.table(store.table)}")
