"""Worker health in Redis: a heartbeat with the state of each loop and circuit breaker.

Each worker writes one key, ``sluice:worker:<name>``, every couple of seconds with a
short TTL, so a dead worker disappears by itself.  Publishing is best effort: with
Redis down, messages keep flowing on the database and the reader says Redis is down.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import socket
import time
from typing import Any, Callable

from core.runtime.breakers import breakers
from core.runtime.redis_wire import RedisWire

log = logging.getLogger("sluice.health")

KEY_PREFIX = "sluice:worker:"
TTL_SECONDS = 15
INTERVAL_SECONDS = 2.0


@functools.lru_cache(maxsize=16)
def _client(redis_url: str) -> RedisWire:
    """One connection per URL for the process: readers such as the alert evaluator ask every
    few seconds, and a new connection each time cost more than the read."""
    return RedisWire(redis_url, timeout=0.5)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class HealthPublisher:
    """A loop: publish this worker's heartbeat, loops and breakers to Redis."""

    name = "health"

    def __init__(self, redis_url: str, loops: Callable[[], list[dict[str, Any]]], name: str | None = None,
                 processed: Callable[[], int] | None = None) -> None:
        self.redis_url = redis_url
        self.loops = loops
        #: Messages this worker's handlers processed since it started (a counter for /metrics).
        self.processed = processed
        self.worker = name or worker_name()
        self._client: RedisWire | None = None
        self._down_since: float | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.worker,
            "last_seen": dt.datetime.now(dt.timezone.utc).isoformat(),
            "loops": self.loops(),
            "breakers": [dataclasses.asdict(b) for b in breakers.snapshot()],
            "processed": self.processed() if self.processed is not None else 0,
        }

    def step(self) -> float:
        try:
            if self._client is None:
                self._client = _client(self.redis_url)
            self._client.setex(KEY_PREFIX + self.worker, TTL_SECONDS, json.dumps(self.snapshot()))
            if self._down_since is not None:
                log.info("Redis is back after %.0f s; health published again", time.monotonic() - self._down_since)
                self._down_since = None
        except Exception as exc:  # noqa: BLE001 — health must never stop the worker
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning("cannot publish health to Redis (%s); messages keep flowing", exc)
            self._client = None
        return INTERVAL_SECONDS

    def close(self) -> None:
        try:
            if self._client is not None:
                self._client.delete(KEY_PREFIX + self.worker)
        except Exception:  # noqa: BLE001
            pass


def read_health(redis_url: str) -> dict[str, Any]:
    """``{"redis": "up"|"down", "workers": [...]}`` — what `sluice status` and /healthz show."""
    try:
        client = _client(redis_url)
        keys = sorted(client.scan(KEY_PREFIX + "*"))
        workers = [json.loads(raw) for raw in client.mget(keys) if raw]
    except Exception as exc:  # noqa: BLE001
        return {"redis": "down", "error": str(exc), "workers": []}
    return {"redis": "up", "workers": workers}
