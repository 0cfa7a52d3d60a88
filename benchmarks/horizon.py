"""``python -m benchmarks horizon``: a steady load through one worker while another session
holds the database's MVCC horizon (PostgreSQL only).

    python -m benchmarks horizon [--rate 5000] [--batch 50] [--duration 190]
        [--hold-from 40] [--hold-for 110] [--autovacuum server|on|off]

A producer thread sends ``--batch`` messages in one ``send_many`` every ``batch / rate``
seconds (catching up when late, so the offered rate holds) into queue ``bench``, served by
one ``sluice worker`` with its defaults and the benchmark's no-op handler.  From
``--hold-from`` for ``--hold-for`` seconds a session of its own holds a transaction id
(``BEGIN; SELECT txid_current();`` then idle, as an idle-in-transaction connection or a
long report does): while it is held no row deleted after it began is dead to everyone, so
neither vacuum nor an index scan can drop the receive's dead index entries.

The worker writes each handled message's commit time to a record file
(benchmarks/handlers.py) and the producer keeps each batch's commit time, so nothing
polls the database while the run is timed.  The JSON line:

- ``worst_held_ratio``: of the 10-second windows that lie wholly inside the hold, the
  lowest of messages handled ÷ messages sent in the window (``worst_held_pct``: the same
  in per cent);
- ``max_backlog_s``: the largest backlog (sent and committed, not yet handled; sampled
  every 0.1 s) in seconds of traffic (at the rate the producer reached);
- ``recovery_s``: seconds from the release until the backlog is back under
  ``max(0.1 s of traffic, the largest backlog before the hold)``; 0 when it never grew
  past that, null when it did not get back within the run and 60 s after it (then
  ``unhandled`` says how many were left);
- ``windows_pct``: each 10-second window's handled ÷ sent, ``sent_per_s`` the rate the
  producer reached (on a busy machine it falls behind ``--rate``), and ``autovacuum`` the
  server's setting during the run.

``--autovacuum on|off`` sets the server's ``autovacuum`` for the run (``ALTER SYSTEM``, a
superuser's right) and puts it back after; ``server`` (the default) leaves it as it is.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (BenchmarkError, Worker, bench_database, log, positive_int, server_url,
                               setup_django, standard_main, worker_env)
from benchmarks.records import NOOP, QUEUE, read_records

HELP = "steady load through one worker while a session holds the MVCC horizon (PostgreSQL)"
WINDOW_S = 10
SAMPLE_S = 0.1
#: A window counts as held when it lies inside the hold to within this many seconds.
HOLD_SLACK_S = 0.25
#: Seconds the worker gets after the load to handle the rest.
CATCH_UP_S = 60


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=positive_int, default=5000, metavar="R",
                        help="messages per second offered (default 5000)")
    parser.add_argument("--batch", type=positive_int, default=50, metavar="B",
                        help="messages per send_many, one every B/R seconds (default 50)")
    parser.add_argument("--duration", type=positive_float, default=190.0, metavar="S",
                        help="seconds of load (default 190)")
    parser.add_argument("--hold-from", type=float, default=40.0, metavar="S",
                        help="second of the load at which the horizon is held (default 40)")
    parser.add_argument("--hold-for", type=positive_float, default=110.0, metavar="S",
                        help="seconds the horizon is held (default 110)")
    parser.add_argument("--autovacuum", choices=("server", "on", "off"), default="server",
                        help="the server's autovacuum for the run (default: as the server has it)")


def main(argv: list[str] | None = None) -> int:
    return standard_main("horizon", HELP, add_arguments, run, argv)


class Producer(threading.Thread):
    """Sends ``batch`` messages every ``batch / rate`` seconds for ``duration`` seconds;
    ``commits`` holds (commit ns, messages) per batch."""

    def __init__(self, rate: int, batch: int, duration: float) -> None:
        super().__init__(name="horizon-producer", daemon=True)
        self.rate, self.batch, self.duration = rate, batch, duration
        self.commits: list[tuple[int, int]] = []
        self.error: BaseException | None = None
        self.started_ns = 0

    def run(self) -> None:
        from django.db import connections, transaction

        from core.transport import Transport

        transport = Transport()
        tick = self.batch / self.rate
        batches = int(self.duration / tick)
        try:
            self.started_ns = time.time_ns()
            start = time.monotonic()
            for k in range(batches):
                lag = start + k * tick - time.monotonic()
                if lag > 0:
                    time.sleep(lag)
                now = time.time_ns()
                bodies = [{"i": k * self.batch + j, "t": now} for j in range(self.batch)]
                with transaction.atomic():
                    transport.send_many(QUEUE, bodies, message_type=NOOP)
                self.commits.append((time.time_ns(), self.batch))
        except BaseException as exc:  # reported by the benchmark's thread
            self.error = exc
        finally:
            connections.close_all()


class Holder:
    """A session of its own that holds a transaction id from ``hold()`` to ``release()``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection = None
        self.held_ns = self.released_ns = 0

    def connect(self) -> None:
        import psycopg

        self.connection = psycopg.connect(self.url)  # not autocommit: the first statement opens a transaction

    def hold(self) -> None:
        self.connection.execute("SELECT txid_current()")
        self.held_ns = time.time_ns()
        log("horizon held (one session idle in a transaction that has an xid)")

    def release(self) -> None:
        if self.connection is not None:
            self.connection.rollback()
            self.released_ns = time.time_ns()
            self.connection.close()
            self.connection = None
            if self.held_ns:
                log("horizon released")


def set_autovacuum(url: str, value: str | None) -> str | None:
    """Set the server's autovacuum ("on" / "off", ALTER SYSTEM + reload; None: back to the
    configuration file's).  Returns what ALTER SYSTEM had set before (None: nothing)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        setting, source = conn.execute(
            "SELECT setting, COALESCE(sourcefile, '') FROM pg_settings WHERE name = 'autovacuum'").fetchone()
        before = setting if source.endswith("postgresql.auto.conf") else None
        try:
            conn.execute("ALTER SYSTEM RESET autovacuum" if value is None else f"ALTER SYSTEM SET autovacuum = {value}")
        except psycopg.errors.InsufficientPrivilege as exc:
            raise BenchmarkError(f"--autovacuum {value} needs a superuser on the server: {exc}") from None
        conn.execute("SELECT pg_reload_conf()")
    if value is None:
        return before
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the reload is asynchronous
        with psycopg.connect(url, autocommit=True) as conn:
            if conn.execute("SHOW autovacuum").fetchone()[0] == value:
                return before
        time.sleep(0.1)
    raise BenchmarkError(f"the server did not take autovacuum = {value}")


def handled_count(path: str) -> int:
    """Lines in the record file, counted without parsing them (it is read while the load runs)."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def backlog_series(commits: list[tuple[int, int]], handled_ns: list[int], start_ns: int,
                   end_ns: int) -> list[tuple[float, int]]:
    """(seconds since start, sent − handled) every SAMPLE_S seconds."""
    handled_ns = sorted(handled_ns)
    series, sent, done, c, h = [], 0, 0, 0, 0
    at = start_ns
    while at <= end_ns:
        while c < len(commits) and commits[c][0] <= at:
            sent += commits[c][1]
            c += 1
        while h < len(handled_ns) and handled_ns[h] <= at:
            done += 1
            h += 1
        series.append(((at - start_ns) / 1e9, sent - done))
        at += int(SAMPLE_S * 1e9)
    return series


def summarise(commits: list[tuple[int, int]], handled_ns: list[int], start_ns: int,
              hold_from: float, hold_to: float) -> dict[str, Any]:
    """The JSON line's figures from the producer's commits and the worker's records: the
    windows over the load, the backlog until the last message was handled."""
    seconds = (commits[-1][0] - start_ns) / 1e9
    windows = []
    for w in range(int(seconds // WINDOW_S)):
        lo, hi = start_ns + w * WINDOW_S * 10**9, start_ns + (w + 1) * WINDOW_S * 10**9
        handled = sum(1 for t in handled_ns if lo <= t < hi)
        # Offered: what the producer sent in the window (on a busy machine it can fall
        # behind the rate it aims at; sent_per_s says by how much).
        sent = sum(n for t, n in commits if lo <= t < hi)
        windows.append({"from_s": w * WINDOW_S, "pct": 100 * handled / sent if sent else 0.0,
                        # (The hold's own instants are taken a few milliseconds after its
                        # scheduled seconds, and the load starts just after the schedule's clock.)
                        "held": hold_from - HOLD_SLACK_S <= w * WINDOW_S and (w + 1) * WINDOW_S <= hold_to + HOLD_SLACK_S})
    offered = sum(n for _, n in commits) / seconds  # what the producer reached: the traffic
    series = backlog_series(commits, handled_ns, start_ns, max(commits[-1][0], max(handled_ns, default=0)))
    before = [b for s, b in series if s < hold_from]
    settled = max(offered * SAMPLE_S, max(before, default=0))
    recovery: float | None = 0.0
    if any(b > settled for s, b in series if s >= hold_from):
        recovery = next((s - hold_to for s, b in series if s >= hold_to and b <= settled), None)
    held = [w["pct"] for w in windows if w["held"]]
    return {
        "worst_held_ratio": min(held) / 100 if held else None,
        "worst_held_pct": min(held) if held else None,
        "max_backlog_s": max(b for _, b in series) / offered if series else None,
        "recovery_s": recovery,
        "windows_pct": [w["pct"] for w in windows],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.hold_from + args.hold_for > args.duration or args.hold_from < 0:
        raise BenchmarkError("the hold must lie within the load (0 <= --hold-from, --hold-from + --hold-for <= "
                             "--duration)")
    if args.duration < args.batch / args.rate:
        raise BenchmarkError("--duration must be long enough for one batch (--batch / --rate seconds)")
    workdir = Path(tempfile.mkdtemp(prefix="sluice-bench-horizon-"))
    record_file = str(workdir / "handled")
    changed = args.autovacuum != "server"
    autovacuum_before = set_autovacuum(server_url(), args.autovacuum) if changed else None
    try:
        with bench_database("postgresql", name="sluice_bench_horizon") as url:
            os.environ["SLUICE_HANDLER_MODULES"] = "benchmarks.handlers"
            setup_django(url)
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SHOW autovacuum")
                autovacuum = cursor.fetchone()[0]
            env = worker_env(url, {"SLUICE_HANDLER_MODULES": "benchmarks.handlers", "SLUICE_LOG_LEVEL": "WARNING",
                                   "BENCH_RECORD_FILE": record_file})
            with Worker(["--queue", QUEUE], env, "horizon worker") as worker:
                worker.wait_ready(120)
                result = load(url, args, record_file, worker)
                worker.terminate()
    finally:
        if changed:
            set_autovacuum(server_url(), autovacuum_before)
    return {"benchmark": "horizon", "db": "postgresql", "rate": args.rate, "batch": args.batch,
            "duration_s": args.duration, "hold_from_s": args.hold_from, "hold_for_s": args.hold_for,
            "autovacuum": autovacuum, **result}


def load(url: str, args: argparse.Namespace, record_file: str, worker: Worker) -> dict[str, Any]:
    """The run itself: the producer for ``duration``, the horizon held in its window, then
    up to CATCH_UP_S for the worker to finish the backlog."""
    producer = Producer(args.rate, args.batch, args.duration)
    holder = Holder(url)
    holder.connect()  # beforehand: the xid is taken at its second, not a connection later
    producer.start()
    started = time.monotonic()
    try:
        time.sleep(args.hold_from)
        holder.hold()
        time.sleep(max(0.0, started + args.hold_from + args.hold_for - time.monotonic()))
    finally:
        holder.release()
    last_report = 0.0
    while producer.is_alive():
        producer.join(1)
        if time.monotonic() - last_report >= 10:
            last_report = time.monotonic()
            log(f"{time.monotonic() - started:.0f} s: {sum(n for _, n in producer.commits)} sent, "
                f"{handled_count(record_file)} handled")
    if producer.error is not None:
        raise BenchmarkError(f"the producer failed: {producer.error!r}")
    sent = sum(n for _, n in producer.commits)
    deadline = time.monotonic() + CATCH_UP_S
    while handled_count(record_file) < sent:
        if not worker.alive():
            raise BenchmarkError(f"the worker exited:\n{worker.tail()}")
        if time.monotonic() > deadline:  # a result all the same: it did not recover (recovery_s null)
            log(f"the worker handled {handled_count(record_file)} of {sent} within {CATCH_UP_S} s "
                "of the load's end")
            break
        time.sleep(1.0)
    end_ns = producer.commits[-1][0]
    start_ns = producer.started_ns
    handled_ns = [r[2] for r in read_records(record_file)]
    figures = summarise(producer.commits, handled_ns, start_ns,
                        (holder.held_ns - start_ns) / 1e9, (holder.released_ns - start_ns) / 1e9)
    log(f"10-second windows, handled ÷ offered: {', '.join(f'{p:.0f} %' for p in figures['windows_pct'])}")
    return {"sent_per_s": sent / ((end_ns - start_ns) / 1e9), "unhandled": sent - len(handled_ns), **figures}


if __name__ == "__main__":
    raise SystemExit(main())
