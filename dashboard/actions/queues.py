"""Actions on queues: delete messages, purge a queue, move a message, pause and resume, limit."""
from __future__ import annotations

from typing import Any, Sequence

from django.db import transaction

from core import failures
from core.runtime import limits, pauses
from core.conf import get_settings
from core.errors import PoisonMessage
from core.messages import Message, decode_headers
from core.queues import queue_model
from core.transport import Transport, row_id_for

from dashboard.actions import validate
from dashboard.actions.audit import acting, describe_ids
from dashboard.actions.errors import ActionError
from dashboard.actions.operations import BrokerUnavailable, enqueue
from dashboard.actions.result import ActionResult
from dashboard.security.audit_log import describe_limits


def delete_messages(user: Any, queue: str, ids: Sequence[str], *, via: str = "") -> ActionResult:
    """Delete messages from a queue by id (the row Id, or the message id it was made from).
    Messages a receiver holds right now are skipped.  ActionError 404 when none was there."""
    with acting(user, "delete_messages", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        ids = validate.string_ids(ids)
        audit.target, audit.ids = describe_ids(f"messages of queue {info.name}", ids), ids
        transport = Transport()
        deleted = sum(1 for message_id in ids if transport.delete(info.name, message_id))
        if not deleted:
            raise ActionError(f"none of the {len(ids)} message(s) is in queue {info.name} "
                              "(already received, deleted, or being processed)", 404)
        audit.detail = f"{deleted} of {len(ids)} deleted"
    return ActionResult("delete_messages", deleted, f"{deleted} message(s) deleted from {info.name}",
                        audit_id=audit.entry_id)


def purge_queue(user: Any, queue: str, confirm: Any, *, via: str = "") -> ActionResult:
    """Delete every message of a queue (rows receivers hold are skipped), as a BulkOperation
    a worker runs in batches (``result.operation_id``; its count is the estimated size).
    ``confirm`` must be the queue's name, typed by the operator: ActionError 400 otherwise;
    409 while a purge of that queue is under way."""
    with acting(user, "purge_queue", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        if not isinstance(confirm, str) or confirm != info.name:
            raise ActionError(f"type the queue name ({info.name}) to confirm the purge")
        running = failures.active_operation("purge", {"queue": info.name})
        if running is not None:
            raise ActionError(f"a purge of {info.name} is already under way (operation {running.pk})", 409)
        op = failures.start_purge(info.name, requested_by=getattr(user, "username", ""))
        audit.operation_id = op.pk
        try:
            enqueue(op)
        except BrokerUnavailable as exc:
            raise ActionError(str(exc), 503) from None
        audit.detail = f"operation {op.pk} queued: about {op.total} message(s)"
    return ActionResult("purge_queue", op.total, f"purge of {info.name} started (operation {op.pk}): "
                        f"about {op.total} message(s)", audit_id=audit.entry_id, operation_id=op.pk)


def move_message(user: Any, queue: str, message_id: str, to_queue: str, *, via: str = "") -> ActionResult:
    """Move one message to another queue as it is (same Id, headers, body and expiry), in one
    transaction.  ActionError 404 when it is not there, 409 when a receiver holds it."""
    with acting(user, "move_message", via, target=f"queue {queue} → {to_queue}") as audit:
        source = validate.queue(queue)
        (message_id,) = validate.string_ids([message_id], "message id")
        target = validate.queue(to_queue)
        if target.name == source.name:
            raise ActionError("the message is already in that queue")
        audit.target, audit.ids = f"message {message_id} of queue {source.name} → {target.name}", [message_id]
        using = get_settings().DATABASE
        transport = Transport(using)
        with transaction.atomic(using=using):
            row = queue_model(source.name).objects.using(using).filter(message_id=row_id_for(message_id)).first()
            if row is None:
                raise ActionError(f"message {message_id} is not in queue {source.name}", 404)
            # Rows never change after the INSERT: the DELETE confirms this transaction owns it.
            if not transport.delete(source.name, message_id):
                raise ActionError(f"message {message_id} is being processed; try again", 409)
            try:
                headers = decode_headers(row.headers)
            except PoisonMessage:
                raise ActionError(f"message {message_id} has unreadable headers (a poison message); "
                                  "it cannot be moved", 409) from None
            message = Message(id=str(row.message_id), headers=headers, body=bytes(row.body or b""),
                              queue=target.name, row_version=0, expires=row.expires,
                              correlation_id=row.correlation_id, reply_to=row.reply_to_address)
            transport.move(message, target.name, headers, keep_expiry=True)
        audit.detail = f"moved to {target.name}"
    return ActionResult("move_message", 1, f"message moved from {source.name} to {target.name}",
                        audit_id=audit.entry_id, message_id=message_id)


def pause_queue(user: Any, queue: str, *, via: str = "") -> ActionResult:
    """Stop every worker receiving from ``queue`` (core.runtime.pauses; sends still land).  Pausing a
    paused queue changes nothing and says so.  ActionError 404 for an unknown queue."""
    with acting(user, "pause_queue", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        paused, changed = pauses.pause(info.name, by=getattr(user, "username", ""), via=via)
        audit.detail = "paused" if changed else f"already paused since {paused.paused_at:%Y-%m-%d %H:%M:%S} UTC"
    text = f"queue {info.name} paused: workers receive nothing from it until it is resumed" if changed \
        else f"queue {info.name} was already paused (by {paused.paused_by or 'someone'})"
    return ActionResult("pause_queue", int(changed), text, audit_id=audit.entry_id)


def resume_queue(user: Any, queue: str, *, via: str = "") -> ActionResult:
    """Let the workers receive from ``queue`` again.  ActionError 404 for an unknown queue."""
    with acting(user, "resume_queue", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        changed = pauses.resume(info.name, by=getattr(user, "username", ""), via=via)
        audit.detail = "resumed" if changed else "was not paused"
    text = f"queue {info.name} resumed" if changed else f"queue {info.name} was not paused"
    return ActionResult("resume_queue", int(changed), text, audit_id=audit.entry_id)


def _limit_input(value: Any, kind: str) -> int | None:
    """A limit from a form or a request: a whole number, or empty / null for none."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"{kind} must be a whole number 1–10000, or empty for no limit, not {str(value)[:40]!r}")
    return value


def limit_queue(user: Any, queue: str, concurrency: Any, rate: Any, *, via: str = "") -> ActionResult:
    """Set an operator's limits on ``queue`` (core.runtime.limits: at most ``concurrency`` messages
    at once and ``rate`` per second across every worker; None for none).  They win over
    SLUICE_QUEUE_LIMITS.  ActionError 404 for an unknown queue, 400 for a bad limit."""
    with acting(user, "limit_queue", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        wanted = {"concurrency": _limit_input(concurrency, "concurrency"), "rate": _limit_input(rate, "rate")}
        try:
            found, changed = limits.set_limits(info.name, **wanted, by=getattr(user, "username", ""), via=via)
        except ValueError as exc:
            raise ActionError(str(exc)) from None
        audit.detail = describe_limits(found) if changed else f"unchanged: {describe_limits(found)}"
    text = f"queue {info.name}: {describe_limits(found)}" if changed else \
        f"queue {info.name} already had these limits ({describe_limits(found)})"
    return ActionResult("limit_queue", int(changed), text, audit_id=audit.entry_id)


def clear_queue_limits(user: Any, queue: str, *, via: str = "") -> ActionResult:
    """Drop the operator's limits on ``queue``: SLUICE_QUEUE_LIMITS applies again.
    ActionError 404 for an unknown queue."""
    with acting(user, "limit_queue", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        changed = limits.clear_limits(info.name, by=getattr(user, "username", ""), via=via)
        found = limits.limits_of(info.name)
        audit.detail = f"cleared: {describe_limits(found)}" if changed else "no limits of an operator to clear"
    text = f"queue {info.name}: operator's limits cleared ({describe_limits(found)})" if changed else \
        f"queue {info.name} had no limits set by an operator"
    return ActionResult("limit_queue", int(changed), text, audit_id=audit.entry_id)
