"""Message expiry (TTL): expired messages on receive, active purging, idle temporary queues.

The database decides whether a row is expired (its own clock, in the receive
statement).  An expired message never reaches a handler: it is dropped, or moved to
the queue's dead-letter queue with a reason header when the queue asks for that.
Expired rows nobody receives are removed actively by :func:`purge_expired_messages`
(Celery beat runs it), and idle temporary queues by :func:`delete_idle_queues`.
"""
from __future__ import annotations

import logging
import time

from django.db import connections, transaction

from core.conf import get_settings
from core.errors import UnknownQueue
from core.messages import Headers, Message
from core.models import QueueRecord
from core.queues import list_queues, registry
from core.transport import Transport

log = logging.getLogger("sluice.expiry")

EXPIRED_REASON = "TTLExpiredException"


def on_expired_receive(transport: Transport, message: Message) -> str:
    """Drop or dead-letter an expired message taken by a receive; returns what it did."""
    info = registry.get(message.queue, transport.using)
    if info.dead_letter_on_expiry and info.dead_letter_queue:
        headers = {**message.headers, Headers.EXPIRED_REASON: EXPIRED_REASON,
                   Headers.FAILED_Q: message.queue}
        headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
        transport.requeue(info.dead_letter_queue, message, headers=headers, expires=False)
        log.info("expired message %s on %s dead-lettered to %s", message.id, message.queue, info.dead_letter_queue)
        return "dead-lettered"
    log.info("expired message %s on %s dropped (expired %s)", message.id, message.queue, message.expires)
    return "dropped"


# -- active purging (run periodically by Celery beat, or as a loop) ----------------------------

def dead_letter_expired(queue: str, batch_size: int, max_batches: int, using: str | None = None) -> int:
    """Move expired rows of ``queue`` to its dead-letter queue, a batch per transaction,
    skipping rows receivers hold.  Returns how many moved."""
    transport = Transport(using)
    d = transport.dialect
    moved = 0
    for _ in range(max_batches):
        with transaction.atomic(using=transport.using):
            with connections[transport.using].cursor() as cursor:
                cursor.execute(d.receive_expired(queue), [batch_size])
                rows = cursor.fetchall()
            for raw in rows:
                message = transport.to_message(queue, d.to_row(raw))
                on_expired_receive(transport, message)
        moved += len(rows)
        if len(rows) < batch_size:
            break
    return moved


def purge_expired_messages(using: str | None = None, batch_size: int | None = None,
                           time_budget: float = 20.0) -> dict[str, int]:
    """Remove expired messages from every queue (dead-lettering where the queue asks),
    in batches of at most ``SLUICE_PURGE_BATCH_SIZE`` (≤ 4,000) that skip locked rows, so
    the purge never waits for — or deadlocks with — a receiver.  Stops after
    ``time_budget`` seconds; the next run carries on.  Returns {queue: removed}."""
    settings = get_settings()
    size = min(batch_size or settings.PURGE_BATCH_SIZE, 4000)
    transport = Transport(using)
    deadline = time.monotonic() + time_budget
    done: dict[str, int] = {}
    for record in list_queues(transport.using):
        if time.monotonic() > deadline:
            break
        try:
            while time.monotonic() < deadline:
                if record.dead_letter_on_expiry and record.dead_letter_queue:
                    n = dead_letter_expired(record.name, size, 1, transport.using)
                else:
                    n = transport.purge(record.name, expired_only=True, batch_size=size, max_batches=1)
                done[record.name] = done.get(record.name, 0) + n
                if n < size:
                    break
        except UnknownQueue:
            continue  # deleted meanwhile
    removed = {k: v for k, v in done.items() if v}
    if removed:
        log.info("purged expired messages: %s", ", ".join(f"{k}={v}" for k, v in removed.items()))
    return removed


def delete_idle_queues(using: str | None = None) -> list[str]:
    """Delete temporary queues idle longer than their auto-delete-on-idle time.

    Idle = no send, receive, peek, browse or update recorded (``last_activity``, kept to
    within 30 s per process), and no message scheduled for it in the delayed store.  A
    send that lands between the check and the drop changes the table's newest
    RowVersion, which is compared again under an exclusive table lock: the queue is
    then kept, so no message is dropped with it.
    """
    from core.delayed import delayed_store, SqlDelayedStore

    transport = Transport(using)
    alias = transport.using
    d = transport.dialect
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        now = d.to_datetime(cursor.fetchone()[0])
    store = delayed_store(alias)
    deleted = []
    candidates = QueueRecord.objects.using(alias).filter(auto_delete_on_idle_seconds__isnull=False)
    for record in candidates:
        last = record.last_activity or record.created_at
        if last is None or (now - last).total_seconds() < record.auto_delete_on_idle_seconds:
            continue
        if isinstance(store, SqlDelayedStore):
            with connections[alias].cursor() as cursor:
                cursor.execute(store.dialect.delayed_has_destination(store.table), [record.name])
                if cursor.fetchone() is not None:
                    continue  # a scheduled message keeps it alive
        if _drop_if_unchanged(record, now, alias):
            deleted.append(record.name)
    if deleted:
        log.info("deleted idle temporary queue(s): %s", ", ".join(deleted))
    return deleted


def _drop_if_unchanged(record: QueueRecord, now, alias: str) -> bool:
    d = Transport(alias).dialect
    with connections[alias].cursor() as cursor:
        cursor.execute(d.max_row_version(record.name), [])
        newest = cursor.fetchone()[0]
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            lock = d.lock_table(record.name)
            if lock:
                cursor.execute(lock, [])
            cursor.execute(d.max_row_version(record.name), [])
            if cursor.fetchone()[0] != newest:
                return False  # something arrived: not idle after all
            fresh = QueueRecord.objects.using(alias).filter(pk=record.pk).values_list("last_activity", flat=True).first()
            if fresh is not None and (now - fresh).total_seconds() < record.auto_delete_on_idle_seconds:
                return False
            for sql, params in d.drop_queue_table(record.name):
                cursor.execute(sql, params)
        QueueRecord.objects.using(alias).filter(pk=record.pk).delete()
    registry.forget(record.name)
    return True
