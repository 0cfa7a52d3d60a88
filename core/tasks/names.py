"""What recognises a task's message and finds its queue, without Django's Tasks framework:
the dashboard reads them on an install that has no framework (no ``tasks`` extra), where
the backend cannot be imported."""
from __future__ import annotations

from django.conf import settings

#: The message type of a task's message (its queue's handler: core.tasks.worker).
TASK_MESSAGE_TYPE = "Sluice.DjangoTask"
#: The header that names the task on its message (the dashboard's message pages show it).
TASK_PATH_HEADER = "Django.Task"  # ("Sluice." names control headers, which producers may not set)


def queue_prefix(backend_alias: str) -> str:
    """The ``QUEUE_PREFIX`` option of TASKS' backend ``backend_alias`` ("" when it has none
    or is gone from TASKS), as SluiceTaskBackend reads it."""
    options = (getattr(settings, "TASKS", None) or {}).get(backend_alias, {}).get("OPTIONS") or {}
    return str(options.get("QUEUE_PREFIX", ""))


def sluice_queue_of(backend_alias: str, queue_name: str) -> str:
    """The Sluice queue (table) of a task queue name under a backend (SluiceTaskBackend.sluice_queue)."""
    return f"{queue_prefix(backend_alias)}{queue_name}"
