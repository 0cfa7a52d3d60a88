"""The dashboard's shared cache: Redis (the Django cache alias ``sluice`` where the project
defines one, else a Redis cache on ``SLUICE_REDIS_URL`` made here) with a per-process
fallback while Redis is down, values scoped to a *generation* that every action starts anew
(so the next page shows its effect), and :func:`shared` values refreshed in a background
thread like the statistics snapshot (dashboard/counting/stats.py), so no viewer waits for an
expensive read once one value exists."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, TypeVar

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import connections

from core.conf import get_settings

log = logging.getLogger("sluice.dashboard")
T = TypeVar("T")

CACHE_ALIAS = "sluice"
#: Seconds to skip the shared cache after it failed (Redis down): no timeout per request.
CACHE_RETRY_AFTER = 10.0
#: A value older than this is never shown; younger but past the cache time, it is shown
#: while a background thread computes the next one.
STALE_LIMIT = 30.0

_local_lock = threading.Lock()
#: One background refresh per cached value at a time in this process.
_refresh_locks: dict[str, threading.Lock] = {}
_local: dict[str, tuple[float, Any]] = {}
_cache_down_until = 0.0


_own: dict[str, Any] = {}


def _cache():
    """The project's ``sluice`` cache, or one of our own on SLUICE_REDIS_URL: the snapshot is
    shared by every process whether or not the host project configured a cache for it."""
    if CACHE_ALIAS in settings.CACHES:
        return caches[CACHE_ALIAS]
    url = get_settings().REDIS_URL
    cache = _own.get(url)
    if cache is None:
        cache = _own[url] = RedisCache(url, {"KEY_PREFIX": "sluice", "OPTIONS": {
            "socket_connect_timeout": 0.5, "socket_timeout": 0.5}})
    return cache


def _cache_get(key: str) -> Any:
    global _cache_down_until
    if time.monotonic() >= _cache_down_until:
        try:
            return _cache().get(key)
        except Exception as exc:  # noqa: BLE001 — Redis down: the page still works
            _cache_down_until = time.monotonic() + CACHE_RETRY_AFTER
            log.warning("dashboard cache unavailable (%s); caching per process", exc)
    with _local_lock:
        hit = _local.get(key)
    return hit[1] if hit and hit[0] > time.monotonic() else None


def _cache_set(key: str, value: Any, seconds: float) -> None:
    global _cache_down_until
    with _local_lock:
        _local[key] = (time.monotonic() + seconds, value)
    if time.monotonic() >= _cache_down_until:
        try:
            _cache().set(key, value, seconds)
        except Exception as exc:  # noqa: BLE001
            _cache_down_until = time.monotonic() + CACHE_RETRY_AFTER
            log.warning("dashboard cache unavailable (%s); caching per process", exc)


def reset_local() -> None:
    """Forget this process's copies and retry Redis at once (tests, :func:`stats.clear_cache`)."""
    global _cache_down_until
    with _local_lock:
        _local.clear()
    _cache_down_until = 0.0


GENERATION_KEY = "sluice:dashboard:generation"


def _scoped(key: str) -> str:
    """``key`` in the current generation: an action starts a new one (stats.forget_snapshot)."""
    return f"{key}:{_cache_get(GENERATION_KEY) or 0}"


def cache_get(key: str) -> Any:
    """A value other dashboard views share through the snapshot's cache (Redis, or per
    process) until the next action (stats.forget_snapshot) or its time is up."""
    return _cache_get(_scoped(key))


def cache_set(key: str, value: Any, seconds: float) -> None:
    if seconds > 0:
        _cache_set(_scoped(key), value, seconds)


def shared(key: str, compute: Callable[[], T]) -> T:
    """``compute()``'s value shared by every viewer like the snapshot: fresh for
    SLUICE_DASHBOARD_CACHE_SECONDS, then returned up to :data:`STALE_LIMIT` old while one
    background thread computes the next, so only the first viewer after an action waits
    for an expensive read (the failed-message groups)."""
    seconds = get_settings().DASHBOARD_CACHE_SECONDS
    if seconds <= 0:
        return compute()
    scoped = _scoped(key)
    hit = _cache_get(scoped)
    if isinstance(hit, tuple) and len(hit) == 2:
        age = time.time() - hit[0]
        if age <= seconds:
            return hit[1]
        if age <= max(STALE_LIMIT, seconds) and get_settings().DASHBOARD_REFRESH_IN_BACKGROUND:
            _refresh_in_background(scoped, lambda: (time.time(), compute()), seconds)
            return hit[1]
    at = time.time()
    value = compute()
    _cache_set(scoped, (at, value), max(STALE_LIMIT, seconds))
    return value


def _refresh_in_background(key: str, compute: Callable[[], Any], seconds: float) -> None:
    """Store ``compute()`` under ``key`` from a thread: one refresh of a key at a time per
    process, and (through the shared cache) across processes."""
    with _local_lock:
        lock = _refresh_locks.setdefault(key, threading.Lock())
    if not lock.acquire(blocking=False):
        return
    refreshing = key + ":refreshing"
    try:
        claimed = _cache().add(refreshing, 1, timeout=max(seconds, 5))
    except Exception:  # noqa: BLE001 — Redis down: this process refreshes its own copy
        claimed = True
    if not claimed:
        lock.release()
        return

    def run() -> None:
        try:
            _cache_set(key, compute(), max(STALE_LIMIT, seconds))
        except Exception:  # noqa: BLE001 — the next request tries again
            log.exception("dashboard refresh of %s failed", key)
        finally:
            connections.close_all()  # this thread's own connections
            try:
                _cache().delete(refreshing)
            except Exception:  # noqa: BLE001
                pass
            lock.release()

    threading.Thread(target=run, name="sluice-stats-refresh", daemon=True).start()
