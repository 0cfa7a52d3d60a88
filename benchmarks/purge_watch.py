"""What the ``purge`` benchmark watches while it runs (benchmarks/purge.py): Pings handled
per second, lock waits in ``pg_stat_activity``, and the purge's batches."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from benchmarks import common

DATABASE_NAME = f"{common.BENCH_DATABASE}_purge"  # sluice_bench_purge unless SLUICE_BENCH_DATABASE says
SAMPLE_INTERVAL = 0.5


def ping_rows() -> int:
    from core.demo.models import PingRecord

    return PingRecord.objects.count()


class PingSampler(threading.Thread):
    """Counts sluice_demo_ping rows every SAMPLE_INTERVAL seconds (its own connection)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="ping-sampler")
        self.samples: list[tuple[float, int]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from django.db import connections

        try:
            while not self._halt.is_set():
                self.samples.append((time.perf_counter(), ping_rows()))
                self._halt.wait(SAMPLE_INTERVAL)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def per_second(self, since: float, until: float | None = None) -> list[int]:
        """Pings handled in each whole second from ``since`` (the count at each second is
        the last sample taken at or before it)."""
        points = sorted(self.samples)
        if not points:
            return []
        end = until if until is not None else points[-1][0]

        def at(moment: float) -> int:
            value = points[0][1]
            for t, count in points:
                if t > moment:
                    break
                value = count
            return value

        marks = [since + s for s in range(int(end - since) + 1)]
        return [at(b) - at(a) for a, b in zip(marks, marks[1:])]


class LockMonitor(threading.Thread):
    """Samples pg_stat_activity of the benchmark database: who waits on a heavyweight
    lock (wait_event_type = 'Lock'), and who blocks them."""

    def __init__(self, purge_pid: int, interval: float) -> None:
        super().__init__(daemon=True, name="lock-monitor")
        self.purge_pid = purge_pid
        self.interval = interval
        self.samples = 0
        self.purge_active = 0      # samples with the purge's statement running
        self.purge_waits = 0       # … and waiting on a lock
        self.receiver_active = 0
        self.receiver_waits = 0
        self.receivers_blocked_by_purge = 0
        self.purge_blocked_by_receiver = 0
        self.examples: list[str] = []
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        import psycopg

        url = common._with_database(common.server_url(), DATABASE_NAME)
        query = (
            "SELECT pid, state, wait_event_type, wait_event, left(query, 60), "
            "CASE WHEN wait_event_type = 'Lock' THEN pg_blocking_pids(pid) END "
            "FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() AND state = 'active'"
        )
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
                while not self._halt.is_set():
                    rows = conn.execute(query, [DATABASE_NAME]).fetchall()
                    self.samples += 1
                    for pid, state, wtype, wevent, text, blockers in rows:
                        is_purge = pid == self.purge_pid
                        is_receive = not is_purge and not text.startswith("SELECT COUNT(*)")
                        if not (is_purge or is_receive):
                            continue
                        waiting = wtype == "Lock"
                        if is_purge:
                            self.purge_active += 1
                            self.purge_waits += waiting
                            if waiting and blockers and any(b != self.purge_pid for b in blockers):
                                self.purge_blocked_by_receiver += 1
                        else:
                            self.receiver_active += 1
                            self.receiver_waits += waiting
                            if waiting and blockers and self.purge_pid in blockers:
                                self.receivers_blocked_by_purge += 1
                        if waiting and len(self.examples) < 10:
                            self.examples.append(f"{'purge' if is_purge else 'receiver'} pid {pid} waits on "
                                                 f"{wevent} held by {blockers}: {text}")
                    self._halt.wait(self.interval)
        except Exception as exc:  # a monitor failure must not sink the measurement
            self.error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def record(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "purge_active": self.purge_active,
            "purge_lock_waits": self.purge_waits,
            "purge_blocked_by_receiver": self.purge_blocked_by_receiver,
            "receiver_active": self.receiver_active,
            "receiver_lock_waits": self.receiver_waits,
            "receivers_blocked_by_purge": self.receivers_blocked_by_purge,
            "error": self.error,
        }


class BatchLog(logging.Handler):
    """Collects the times of the "purged N expired messages from Q" records (one per batch:
    purge_expired_messages calls Transport.purge with max_batches=1)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[float, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("purged") and len(record.args) >= 1:
            self.records.append((time.perf_counter(), int(record.args[0])))
