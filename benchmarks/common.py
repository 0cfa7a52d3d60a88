"""Shared pieces of the benchmarks: a throw-away database, Django set-up, worker
subprocesses, progress on stderr and the one-line JSON result."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit, urlunsplit

REPO_ROOT = Path(__file__).resolve().parent.parent
MANAGE_PY = REPO_ROOT / "manage.py"
DEFAULT_POSTGRES_URL = "postgresql://sluice:sluice@127.0.0.1:5432/sluice"
POSTGRES_URL_ENV = "SLUICE_BENCH_POSTGRES_URL"
#: The transport benchmark's PostgreSQL database (SLUICE_BENCH_DATABASE: another name, so that
#: two checkouts on one server do not drop each other's).
BENCH_DATABASE = os.environ.get("SLUICE_BENCH_DATABASE", "sluice_bench")
DATABASES = ("sqlite", "postgresql")


class BenchmarkError(RuntimeError):
    """The benchmark could not measure what it promised (lost or duplicated messages,
    a worker that died, a timeout).  Reported on stderr; exit status 1; no JSON line."""


# -- output --------------------------------------------------------------------------
def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


class Progress:
    """A progress indicator on stderr: an updating line on a terminal, otherwise one
    line per tenth of the way."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = max(total, 1)
        self.tty = sys.stderr.isatty()
        self._last_step = -1
        self._last_draw = 0.0
        self.started = time.perf_counter()

    def update(self, done: int) -> None:
        if self.tty:
            now = time.perf_counter()
            if now - self._last_draw < 0.1 and done < self.total:
                return
            self._last_draw = now
            sys.stderr.write(f"\r[bench] {self.label}: {done}/{self.total} ({100 * done // self.total}%)")
            sys.stderr.flush()
            return
        step = 10 * done // self.total
        if step > self._last_step:
            self._last_step = step
            log(f"{self.label}: {done}/{self.total} ({10 * step}%)")

    def done(self, note: str = "") -> None:
        if self.tty:
            sys.stderr.write("\n")
        elapsed = time.perf_counter() - self.started
        log(f"{self.label}: finished in {elapsed:.2f} s{'; ' + note if note else ''}")


def rounded(value: Any, places: int = 1) -> Any:
    """Floats to one decimal (``…_ratio`` keys: three, as a ratio's first decimal is most of
    it); NaN and infinities to None."""
    if isinstance(value, float):
        return round(value, places) if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: rounded(v, 3 if k.endswith("_ratio") else 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, places) for v in value]
    return value


def emit_result(result: dict[str, Any]) -> None:
    """The one line on stdout: the result as JSON, floats rounded to one decimal (``…_ratio``
    keys to three)."""
    sys.stdout.write(json.dumps(rounded(result)) + "\n")
    sys.stdout.flush()


def rate(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


# -- arguments -------------------------------------------------------------------------
def _whole_number(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, not {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "0 or more")


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", choices=DATABASES, required=True,
                        help=f"sqlite: a temporary file; postgresql: a fresh database {BENCH_DATABASE!r} "
                             f"on the server of ${POSTGRES_URL_ENV} (default {DEFAULT_POSTGRES_URL})")


def standard_main(name: str, description: str, add_arguments, run, argv: list[str] | None) -> int:
    """The whole ``main`` of a benchmark that parses its options, runs, and prints its
    result as its JSON line (``python -m benchmarks NAME``)."""

    def body(argv):
        parser = argparse.ArgumentParser(prog=f"python -m benchmarks {name}", description=description)
        add_arguments(parser)
        emit_result(run(parser.parse_args(argv)))

    return run_main(body, argv)


def run_main(module_main, argv: list[str] | None) -> int:
    """Shared body of each benchmark's ``main``: turn failures into a clear stderr message.
    SIGTERM unwinds like Ctrl-C, so workers are stopped and the database is removed."""

    def on_sigterm(signum, frame):
        log("terminated (SIGTERM): stopping workers, removing the database")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        module_main(argv)
    except BenchmarkError as exc:
        log(f"FAILED: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    return 0


# -- the benchmark's own database ----------------------------------------------------------
def server_url() -> str:
    """The PostgreSQL server benchmarks make their databases on (its admin database's URL)."""
    return os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@contextlib.contextmanager
def bench_database(kind: str, name: str = BENCH_DATABASE) -> Iterator[str]:
    """A fresh, empty database for one benchmark run; yields its DATABASE_URL and removes
    it afterwards (also when the run fails).  ``name``: the PostgreSQL database — each
    benchmark has its own, so two can run at once."""
    if kind == "sqlite":
        directory = tempfile.mkdtemp(prefix="sluice-bench-")
        try:
            path = Path(directory) / "bench.sqlite3"
            log(f"database: sqlite file {path}")
            yield f"sqlite:///{path}"  # absolute path: sqlite:////tmp/…
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    if kind != "postgresql":
        raise ValueError(f"unknown database kind {kind!r}")
    import psycopg
    from psycopg import sql

    server = server_url()
    ident = sql.Identifier(name)

    def admin(statement) -> None:
        with psycopg.connect(server, autocommit=True, connect_timeout=10) as conn:
            conn.execute(statement)

    try:
        admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        admin(sql.SQL("CREATE DATABASE {}").format(ident))
    except psycopg.Error as exc:
        raise BenchmarkError(f"cannot (re)create database {name} via {_redact(server)}: {exc}") from exc
    url = _with_database(server, name)
    log(f"database: postgresql {_redact(url)}")
    try:
        yield url
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django never set up: nothing to close
            pass
        try:
            admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        except psycopg.Error as exc:
            log(f"warning: could not drop database {name}: {exc}")


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


def setup_django(database_url: str) -> None:
    """Point this process at the benchmark database, set Django up and create Sluice's
    tables and queues (``error`` and ``demo``).  Once per process."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "sluice.settings"
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import django

    django.setup()
    from core.setup import setup_infrastructure

    started = time.perf_counter()
    done = setup_infrastructure()
    log(f"setup: {', '.join(name for name, _ in done)} in {time.perf_counter() - started:.2f} s")


def database_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
        else:
            cursor.execute("SELECT sqlite_version()")
        return str(cursor.fetchone()[0])


# -- worker subprocesses ------------------------------------------------------------------
#: Workers refuse to start with DEBUG off and no secret key of their own (core/startup.py);
#: a benchmark's workers, on a throwaway database, get a random one unless one is set.
BENCH_SECRET_KEY = secrets.token_urlsafe(50)


def worker_env(database_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SECRET_KEY", BENCH_SECRET_KEY)
    env.update({
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "sluice.settings",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


class Worker:
    """``python manage.py sluice worker …`` as a subprocess, its output collected by
    reader threads (stdout lines also echoed to our stderr, prefixed)."""

    READY_TEXT = "worker serving"
    #: Lines on the worker's stderr that point at trouble in the engine.
    TROUBLE = ("Traceback", "ERROR", "WARNING", "CRITICAL", "Exception", "Error:")

    def __init__(self, args: list[str], env: dict[str, str], label: str = "worker", echo: bool = False) -> None:
        self.command = [sys.executable, str(MANAGE_PY), "sluice", "worker", *args]
        self.env = env
        self.label = label
        self.echo = echo
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.ready = threading.Event()
        self.ready_at: float | None = None
        self.started_at: float | None = None
        self.exited_at: float | None = None
        self.process: subprocess.Popen | None = None
        self._readers: list[threading.Thread] = []

    def start(self) -> "Worker":
        self.started_at = time.perf_counter()
        self.process = subprocess.Popen(self.command, cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        for stream, sink, is_stdout in ((self.process.stdout, self.stdout, True),
                                        (self.process.stderr, self.stderr, False)):
            thread = threading.Thread(target=self._read, args=(stream, sink, is_stdout), daemon=True)
            thread.start()
            self._readers.append(thread)
        return self

    def _read(self, stream, sink: list[str], is_stdout: bool) -> None:
        for line in stream:
            line = line.rstrip("\n")
            sink.append(line)
            if is_stdout and not self.ready.is_set() and self.READY_TEXT in line:
                self.ready_at = time.perf_counter()
                self.ready.set()
            if self.echo or (not is_stdout and any(t in line for t in self.TROUBLE)):
                log(f"{self.label}{'' if is_stdout else ' (stderr)'}: {line}")

    def wait_ready(self, timeout: float) -> float:
        """Seconds from start to the "worker serving" line."""
        deadline = time.perf_counter() + timeout
        while not self.ready.wait(0.05):
            if self.process.poll() is not None:
                self._join_readers()
                raise BenchmarkError(f"{self.label} exited ({self.process.returncode}) before serving:\n{self.tail()}")
            if time.perf_counter() > deadline:
                self.kill()
                raise BenchmarkError(f"{self.label} did not print {self.READY_TEXT!r} within {timeout:g} s:\n{self.tail()}")
        return self.ready_at - self.started_at

    def wait(self, timeout: float) -> float:
        """Wait for the worker to exit on its own; seconds from start to exit.  A non-zero
        exit status or a timeout is a BenchmarkError."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchmarkError(f"{self.label} still running after {timeout:g} s:\n{self.tail()}") from None
        self.exited_at = time.perf_counter()
        self._join_readers()
        if self.process.returncode != 0:
            raise BenchmarkError(f"{self.label} exited with status {self.process.returncode}:\n{self.tail()}")
        return self.exited_at - self.started_at

    def terminate(self, timeout: float = 30.0) -> float:
        """SIGTERM (the worker finishes in-flight messages), then wait; seconds to stop."""
        if self.process is None or self.process.poll() is not None:
            self._join_readers()
            return 0.0
        sent = time.perf_counter()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchmarkError(f"{self.label} ignored SIGTERM for {timeout:g} s:\n{self.tail()}") from None
        self.exited_at = time.perf_counter()
        self._join_readers()
        if self.process.returncode not in (0, -signal.SIGTERM):
            raise BenchmarkError(f"{self.label} exited with status {self.process.returncode} after SIGTERM:\n{self.tail()}")
        return self.exited_at - sent

    def serving_seconds(self) -> float | None:
        """Seconds from the "worker serving" line to exit (None: no such line / still running)."""
        if self.ready_at is None or self.exited_at is None:
            return None
        return self.exited_at - self.ready_at

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._join_readers()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _join_readers(self) -> None:
        for thread in self._readers:
            thread.join(5)

    def trouble(self) -> list[str]:
        """stderr lines that look like errors or warnings."""
        return [line for line in self.stderr if any(t in line for t in self.TROUBLE)]

    def stats_line(self) -> str | None:
        """The worker's closing "QUEUE: received …" line."""
        return next((line for line in reversed(self.stdout) if ": received " in line), None)

    def tail(self, lines: int = 30) -> str:
        out = [f"  stdout| {line}" for line in self.stdout[-lines:]]
        err = [f"  stderr| {line}" for line in self.stderr[-lines:]]
        return "\n".join(out + err) or "  (no output)"

    def __enter__(self) -> "Worker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()  # only does something when the worker is still running (an error path)
