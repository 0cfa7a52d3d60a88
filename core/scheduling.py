"""Sending later, below the transport: the delayed-store interface, the stored value,
due-time validation, and the one configured store of each process.

This module sits under :mod:`core.transport` (which stores delayed sends) and
:mod:`core.receive.recoverability` (which stores delayed retries); the SQL store and the mover
in :mod:`core.delayed` sit above them both.  The configured store is found by its
dotted path (``SLUICE_DELAYED_STORE``), so nothing here imports the package that
implements it.
"""
from __future__ import annotations

import datetime as dt
import importlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from core.conf import get_settings
from core.errors import InvalidMessage
from core.messages import Headers

MAX_DELAY_SECONDS = 100 * 365 * 24 * 3600


@dataclass
class DelayedMessage:
    """A message waiting in the delayed store."""

    id: str
    destination: str
    body: bytes
    headers: dict[str, str]
    due: dt.datetime | None = None  # None with ``delay``: the store computes it
    retry_count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def message_type(self) -> str | None:
        return self.headers.get(Headers.ENCLOSED_MESSAGE_TYPES)


@runtime_checkable
class DelayedMessageStore(Protocol):
    """The interface a delayed-message store implements (the SQL store is one)."""

    def setup_infrastructure(self) -> None:
        """Create what the store needs (tables); idempotent."""

    def store(self, message: DelayedMessage, delay: float | None = None) -> None:
        """Keep ``message`` until ``message.due`` (or ``delay`` seconds from now)."""

    def remove(self, message: DelayedMessage) -> bool:
        """Forget a forwarded message; False when it was already gone."""

    def increment_failure_count(self, message: DelayedMessage) -> bool:
        """Count a failed forward; False when the message was already gone."""

    def next(self) -> dt.datetime | None:
        """When the earliest stored message is due, or None when the store is empty."""

    def fetch_next_due(self, at: dt.datetime) -> DelayedMessage | None:
        """The earliest message due at ``at``, locked against other pollers, or None."""


_stores: dict[tuple[str, str, str], DelayedMessageStore] = {}
_stores_lock = threading.Lock()


def delayed_store(using: str | None = None) -> DelayedMessageStore:
    """The configured store (``SLUICE_DELAYED_STORE``) for a database alias: one instance
    per process, so its circuit breaker sees every failure of the process."""
    settings = get_settings()
    alias = using or settings.DATABASE
    path = settings.DELAYED_STORE
    key = (path, alias, settings.delayed_table)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            module, _, name = path.rpartition(".")
            store = getattr(importlib.import_module(module), name)(using=alias)
            _stores[key] = store
        return store


def resolve_due(delay: Any = None, deliver_at: Any = None) -> tuple[float | None, dt.datetime | None]:
    """Validate a delay (seconds) or an absolute time.  Returns (delay, deliver_at) with at
    most one set, or (None, None) for "deliver now" (no delay, zero delay, a past time)."""
    if delay is not None and deliver_at is not None:
        raise InvalidMessage("give a delay or a delivery time, not both")
    if delay is not None:
        return _resolve_delay(delay)
    if deliver_at is not None:
        return None, _resolve_deliver_at(deliver_at)
    return None, None


def _resolve_delay(delay: Any) -> tuple[float | None, None]:
    if isinstance(delay, dt.timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        try:
            delay = float(str(delay))
        except ValueError:
            raise InvalidMessage(f"delay must be a number of seconds, not {delay!r}") from None
    if math.isnan(delay) or math.isinf(delay) or delay < 0:
        raise InvalidMessage(f"delay must be a finite number of seconds, 0 or more (got {delay!r})")
    if delay > MAX_DELAY_SECONDS:
        raise InvalidMessage(f"a delay of {delay:g} s is more than 100 years")
    return (float(delay), None) if delay > 0 else (None, None)


def _resolve_deliver_at(deliver_at: Any) -> dt.datetime | None:
    if isinstance(deliver_at, str):
        try:
            deliver_at = dt.datetime.fromisoformat(deliver_at.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidMessage(f"delivery time must be ISO 8601 with an offset, not {deliver_at!r}") from None
    if not isinstance(deliver_at, dt.datetime):
        raise InvalidMessage(f"delivery time must be a datetime, not {type(deliver_at).__name__}")
    if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
        raise InvalidMessage("delivery time must be timezone-aware (e.g. 2026-11-22T10:00:00Z); "
                             "naive times are refused rather than guessed")
    deliver_at = deliver_at.astimezone(dt.timezone.utc)
    now = dt.datetime.now(dt.timezone.utc)
    if deliver_at > now + dt.timedelta(seconds=MAX_DELAY_SECONDS):
        raise InvalidMessage(f"delivery time {deliver_at.isoformat()} is more than 100 years away")
    # Already past: straight into the queue.  (This one comparison uses our clock; a
    # time a moment ahead of it still goes through the store, whose clock decides.)
    return None if deliver_at <= now else deliver_at


def store_name(store: DelayedMessageStore) -> str:
    """What a store is called in logs, leases and the ``FailedQ`` of a message it could not
    forward: its table, or its class for a store without one."""
    return getattr(store, "table", type(store).__name__)
