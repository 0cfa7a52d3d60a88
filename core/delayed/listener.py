"""The PostgreSQL LISTEN connection that wakes movers (and pumps): one per process and
database alias, in core.runtime.wakeups; the names are kept here for the delayed package."""
from __future__ import annotations

from core.runtime.wakeups import PostgresListener, acquire_listener, connection_params as listen_params, \
    release_listener

__all__ = ["PostgresListener", "acquire_listener", "listen_params", "release_listener"]
