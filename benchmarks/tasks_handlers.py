"""The tasks benchmark's no-op message handler (SLUICE_HANDLER_MODULES of its Sluice worker):
Sluice's own message end to end, measured beside the tasks in the same run."""
from __future__ import annotations

from core.handlers import handler

#: The queue of the plain messages.
MESSAGE_QUEUE = "bench_messages"


@handler(MESSAGE_QUEUE, "Noop")
def noop(message, context) -> None:
    return None
