"""Delayed delivery: the SQL store and the mover that forwards due messages.

- :mod:`core.scheduling` (below the transport): the store interface
  (:class:`DelayedMessageStore`), :class:`DelayedMessage`, due-time validation
  (:func:`resolve_due`) and the process's configured store (:func:`delayed_store`).
- :mod:`core.delayed.sql_store`: :class:`SqlDelayedStore`, the store in a table.
- :mod:`core.delayed.wake`: the in-process wake hub and the NOTIFY payload.
- :mod:`core.delayed.listener`: the PostgreSQL LISTEN connection.
- :mod:`core.delayed.mover`: :class:`DelayedMover`, the loop.
- :mod:`core.delayed.clearing`: when the mover takes forwarded messages out of the store
  (with the queue insert, or after it committed).
"""
from __future__ import annotations

from core.delayed.listener import PostgresListener
from core.delayed.mover import DelayedMover
from core.delayed.sql_store import DelayedStoreUnavailable, SqlDelayedStore
from core.delayed.wake import NOTIFY_CHANNEL, WakeHub, wake_hub
from core.scheduling import DelayedMessage, DelayedMessageStore, delayed_store, resolve_due

__all__ = ["DelayedMessage", "DelayedMessageStore", "DelayedMover", "DelayedStoreUnavailable",
           "NOTIFY_CHANNEL", "PostgresListener", "SqlDelayedStore", "WakeHub", "delayed_store",
           "resolve_due", "wake_hub"]
