"""Workers as the monitoring tab flags them: a heartbeat gone stale, a clock that disagrees
with the database's, a loop whose thread died (the heartbeats core.runtime.health writes to Redis)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from core.runtime.health import INTERVAL_SECONDS, TTL_SECONDS, read_health
from core.monitoring.live import US, micros
from core.db import database_now_us

#: A heartbeat this much older than the database's clock is stale (three missed beats).
STALE_SECONDS = 3 * INTERVAL_SECONDS
#: A heartbeat from further in the future than this means the worker's clock runs ahead.
AHEAD_TOLERANCE = 1.0


@dataclass(frozen=True)
class WorkerState:
    name: str
    last_seen: dt.datetime | None
    #: Database clock − the heartbeat's time (seconds; negative: the worker's clock is ahead).
    age_seconds: float | None
    stale: bool
    #: Why the worker's clock looks wrong ("" when it does not).
    clock_skew: str = ""
    #: Loops whose thread died.
    dead_loops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workers:
    redis: str
    workers: list[WorkerState]
    error: str = ""


def worker_states(redis_url: str, now_us: int | None = None) -> Workers:
    """Every worker's heartbeat checked against the database's clock.  A heartbeat lives
    :data:`core.runtime.health.TTL_SECONDS` in Redis: one older than that that is still there was
    written by a clock running behind; one from the future, by a clock running ahead."""
    raw = read_health(redis_url)
    if raw.get("redis") != "up":
        return Workers("down", [], str(raw.get("error", "")))
    now = database_now_us() if now_us is None else now_us
    states = []
    for w in raw.get("workers", []):
        try:
            seen = dt.datetime.fromisoformat(str(w.get("last_seen") or ""))
        except ValueError:
            seen = None
        age = (now - micros(seen)) / US if seen is not None else None
        skew = ""
        if age is not None and age < -AHEAD_TOLERANCE:
            skew = f"clock {-age:.1f} s ahead of the database's"
        elif age is not None and age > TTL_SECONDS + INTERVAL_SECONDS:
            skew = f"clock {age:.1f} s behind the database's"
        dead = tuple(str(loop.get("name")) for loop in w.get("loops", []) if loop.get("alive") is False)
        states.append(WorkerState(str(w.get("name", "?")), seen, age,
                                  age is None or (age > STALE_SECONDS and not skew), skew, dead))
    return Workers("up", sorted(states, key=lambda s: s.name))
