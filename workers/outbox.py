"""The outbox's Celery destination: ``apply_async`` that happens only if the transaction commits.

``transaction.on_commit(lambda: task.delay(...))`` publishes after the commit, but a
process that dies between the commit and the publish loses the task.  Through the
outbox the task is stored with the business writes and published in phase 2; if the
process dies first, the background dispatcher publishes it::

    from workers.outbox import send_task_via_outbox

    with transaction.atomic(), OutboxSession() as session:
        order.save()
        send_task_via_outbox(session, "shop.tasks.email_receipt", args=[order.pk])

    @handler("orders", "PlaceOrder")              # pump in SLUICE_TRANSACTION_MODE=outbox
    def place(message, context):
        send_task_via_outbox(context, "shop.tasks.email_receipt", args=[...])

The task id is fixed when the task is stored, so a task published twice (a crash
between publishing and marking the record dispatched; core.outbox.dispatch) arrives
twice with the same id.  The task id is its idempotency key: Celery does not drop a
repeated id, so a task that must run once does its work in
``OutboxSession(message_id=f"task-{self.request.id}")`` (a bound task), or checks the id
itself.

Importing this module registers the ``celery`` destination; core imports it by name
when it first needs it (SLUICE_OUTBOX_DESTINATION_MODULES), never directly.
"""
from __future__ import annotations

import uuid
from typing import Any, Iterable, Mapping

from core.errors import InvalidMessage
from core.outbox import collector_for, register_destination

KIND = "celery"


def publish(op: dict[str, Any]) -> None:
    """Phase 2: publish the stored task to the broker."""
    from workers.celery import app  # here, not at import: importing the app sets Django up

    app.send_task(op["task"], args=op["args"], kwargs=op["kwargs"], task_id=op["task_id"], **op["options"])


def validate(op: dict[str, Any]) -> None:
    """Send time: refuse what could never be published."""
    if not isinstance(op.get("task"), str) or not op["task"].strip():
        raise InvalidMessage(f"Celery task name must be a non-empty string, not {op.get('task')!r}")
    if not isinstance(op.get("args"), list) or not isinstance(op.get("kwargs"), dict) \
            or not isinstance(op.get("options"), dict):
        raise InvalidMessage("Celery args must be a list, kwargs and options mappings")
    if "eta" in op["options"]:
        raise InvalidMessage("use countdown (seconds) rather than eta with the outbox: eta is not stored as JSON")


register_destination(KIND, publish, validate)


def send_task_via_outbox(target: Any, name: str, args: Iterable[Any] | None = None,
                         kwargs: Mapping[str, Any] | None = None, **options: Any) -> str:
    """Publish Celery task ``name`` through the outbox of ``target`` (an OutboxSession, or
    a handler context in outbox mode).  ``options`` are apply_async's (queue, countdown,
    priority, …).  Arguments must be JSON-serializable; if not, this raises here, in the
    transaction.  Returns the task id."""
    task_id = str(options.pop("task_id", None) or uuid.uuid4())
    collector_for(target).add(KIND, {"task": name, "args": list(args or []), "kwargs": dict(kwargs or {}),
                                     "options": options, "task_id": task_id})
    return task_id
