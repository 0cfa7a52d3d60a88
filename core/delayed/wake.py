"""Waking movers when a store makes an earlier message due.

The mechanism is the process's one (core.runtime.wakeups): in-process, :data:`wake_hub` keyed
by the store's table (every store of this process calls it at commit); across processes
on PostgreSQL, ``NOTIFY`` on :data:`NOTIFY_CHANNEL` with the payload
``<table>|<due epoch>`` (``*|0``: "look now"), heard by the process's one listener.
"""
from __future__ import annotations

from core.runtime.wakeups import DELAYED_CHANNEL, WakeHub, on_commit_wake, wake_hub

NOTIFY_CHANNEL = DELAYED_CHANNEL


def notify_payload(table: str, due_epoch: float) -> str:
    return f"{table}|{due_epoch:.6f}"


__all__ = ["NOTIFY_CHANNEL", "WakeHub", "notify_payload", "on_commit_wake", "wake_hub"]
