"""What recognises a task's message and finds its queue and its stored result, without
Django's Tasks framework: the dashboard reads them on an install that has no framework
(no ``tasks`` extra), where the backend cannot be imported."""
from __future__ import annotations

from django.conf import settings

from core.models import TaskResultRecord

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


def is_task_message(message_type: str | None) -> bool:
    """Whether a message's type (its EnclosedMessageTypes, most specific first) is a task's."""
    return (message_type or "").split(";")[0].split(",")[0].strip() == TASK_MESSAGE_TYPE


def stored_result(result_id: str, using: str) -> TaskResultRecord | None:
    """A task's result row as stored, whatever its backend; None when there is none, or for
    an id no result can have (longer than the key, or with a NUL, which PostgreSQL refuses)."""
    if len(result_id) > TaskResultRecord._meta.pk.max_length or "\x00" in result_id:
        return None
    return TaskResultRecord.objects.using(using).filter(pk=result_id).first()
