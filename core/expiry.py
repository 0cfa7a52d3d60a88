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
from core.models import QueueKind, QueueRecord
from core.queues import QueueInfo, create_queue, list_queues, registry
from core.scheduling import delayed_store
from core.transport import MAX_PURGE_BATCH, Transport

log = logging.getLogger("sluice.expiry")

EXPIRED_REASON = "TTLExpiredException"
#: Expired rows taken per statement when dead-lettering (each with its body in memory).
DEAD_LETTER_ROWS_PER_STATEMENT = 100
#: A dead-letter batch (one transaction, one log line) ends once its bodies pass this.
DEAD_LETTER_BYTES_PER_BATCH = 8 * 1024 * 1024


def _dead_letter_headers(message: Message) -> dict[str, str]:
    headers = {**message.headers, Headers.EXPIRED_REASON: EXPIRED_REASON, Headers.FAILED_Q: message.queue}
    headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
    return headers


def on_expired_receive(transport: Transport, message: Message) -> str:
    """Drop or dead-letter an expired message taken by a receive; returns what it did."""
    info = registry.get(message.queue, transport.using)
    if info.dead_letter_on_expiry and info.dead_letter_queue:
        transport.move_to_holding(message, info.dead_letter_queue, _dead_letter_headers(message),
                                  QueueKind.DEAD_LETTER)
        log.info("expired message %s on %s dead-lettered to %s", message.id, message.queue, info.dead_letter_queue)
        return "dead-lettered"
    log.info("expired message %s on %s dropped (expired %s)", message.id, message.queue, message.expires)
    return "dropped"


# -- active purging (run periodically by Celery beat, or as a loop) ----------------------------

def dead_letter_expired(queue: str, batch_size: int, max_batches: int, using: str | None = None) -> int:
    """Move expired rows of ``queue`` to its dead-letter queue, skipping rows receivers
    hold.  A batch is one transaction of up to ``batch_size`` rows, taken
    :data:`DEAD_LETTER_ROWS_PER_STATEMENT` at a time and inserted with one executemany
    each, ending early once :data:`DEAD_LETTER_BYTES_PER_BATCH` of bodies have moved;
    one log line per batch.  Returns how many moved."""
    transport = Transport(using)
    info = registry.get(queue, transport.using)
    moved = 0
    for _ in range(max_batches):
        count, exhausted = _dead_letter_batch(transport, info, batch_size)
        moved += count
        if exhausted:
            break
    return moved


def _dead_letter_batch(transport: Transport, info: QueueInfo, batch_size: int) -> tuple[int, bool]:
    """One transaction's worth; returns (rows moved, whether the expired rows ran out)."""
    d = transport.dialect
    moved = size = 0
    exhausted = False
    with transaction.atomic(using=transport.using):
        while moved < batch_size and size < DEAD_LETTER_BYTES_PER_BATCH:
            want = min(DEAD_LETTER_ROWS_PER_STATEMENT, batch_size - moved)
            with connections[transport.using].cursor() as cursor:
                cursor.execute(d.receive_expired(info.name), [want])
                rows = cursor.fetchall()
            messages = [transport.to_message(info.name, d.to_row(raw)) for raw in rows]
            transport.enqueue([transport.moved(m, info.dead_letter_queue or "", _dead_letter_headers(m))
                               for m in messages])
            moved += len(messages)
            size += sum(len(m.body) for m in messages)
            if len(rows) < want:
                exhausted = True
                break
    if moved:
        log.info("dead-lettered %d expired message(s) (%d body bytes) from %s to %s",
                 moved, size, info.name, info.dead_letter_queue)
    return moved, exhausted


def _recreate_dead_letter_queue(record: QueueRecord, using: str) -> None:
    """After an UnknownQueue while dead-lettering: when the queue itself is still there, its
    dead-letter queue is the one missing; recreate it (loudly), so expired messages move
    next time instead of piling up."""
    if not (record.dead_letter_on_expiry and record.dead_letter_queue):
        return
    try:
        registry.get(record.name, using)
    except UnknownQueue:
        return  # the queue itself was deleted meanwhile
    log.error("dead-letter queue %s of %s is missing: recreating it", record.dead_letter_queue, record.name)
    create_queue(record.dead_letter_queue, kind=QueueKind.DEAD_LETTER, using=using)


def purge_expired_messages(using: str | None = None, batch_size: int | None = None,
                           time_budget: float = 20.0) -> dict[str, int]:
    """Remove expired messages from every queue (dead-lettering where the queue asks),
    in batches of at most ``SLUICE_PURGE_BATCH_SIZE`` (≤ 4,000) that skip locked rows, so
    the purge never waits for — or deadlocks with — a receiver.  Stops after
    ``time_budget`` seconds; the next run carries on.  Returns {queue: removed}."""
    settings = get_settings()
    size = min(batch_size or settings.PURGE_BATCH_SIZE, MAX_PURGE_BATCH)
    transport = Transport(using)
    deadline = time.monotonic() + time_budget
    done: dict[str, int] = {}
    for record in list_queues(transport.using):
        if time.monotonic() > deadline:
            break
        try:
            while time.monotonic() < deadline:
                if record.dead_letter_on_expiry and record.dead_letter_queue:
                    n, exhausted = _dead_letter_batch(transport, registry.get(record.name, transport.using), size)
                else:
                    n = transport.purge(record.name, expired_only=True, batch_size=size, max_batches=1)
                    exhausted = n < size
                done[record.name] = done.get(record.name, 0) + n
                if exhausted:
                    break
        except UnknownQueue:
            _recreate_dead_letter_queue(record, transport.using)  # or the queue was deleted meanwhile
    removed = {k: v for k, v in done.items() if v}
    if removed:
        log.info("purged expired messages: %s", ", ".join(f"{k}={v}" for k, v in removed.items()))
    return removed


def delete_idle_queues(using: str | None = None) -> list[str]:
    """Delete temporary queues idle longer than their auto-delete-on-idle time.

    Idle = no send, receive, peek, browse or update recorded (``last_activity``, written
    at most every 30 s per process), and no message scheduled for it in the delayed
    store.  The table is dropped only when it is *empty*, checked under an exclusive
    table lock (PostgreSQL ``LOCK TABLE``, SQL Server ``TABLOCKX``, SQLite's one
    writer): a send in flight holds the table, so the check waits for it and then sees
    its row; a send that starts later waits for the drop and then fails clearly on the
    missing table (UnknownQueue once the registry row is gone).  So no message is ever
    dropped with its queue.
    """
    transport = Transport(using)
    alias = transport.using
    d = transport.dialect
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        now = d.to_datetime(cursor.fetchone()[0])
    store = delayed_store(alias)
    has_destination = getattr(store, "has_destination", None)
    deleted = []
    candidates = QueueRecord.objects.using(alias).filter(auto_delete_on_idle_seconds__isnull=False)
    for record in candidates:
        if not _idle(record, now):
            continue
        if has_destination is not None and has_destination(record.name):
            continue  # a scheduled message keeps it alive
        if _drop_if_idle_and_empty(record, now, alias):
            deleted.append(record.name)
    if deleted:
        log.info("deleted idle temporary queue(s): %s", ", ".join(deleted))
    return deleted


def _idle(record: QueueRecord, now) -> bool:
    last = record.last_activity or record.created_at
    return last is not None and (now - last).total_seconds() >= record.auto_delete_on_idle_seconds


def _drop_if_idle_and_empty(record: QueueRecord, now, alias: str) -> bool:
    d = Transport(alias).dialect
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            lock = d.lock_table(record.name)
            if lock:
                cursor.execute(lock, [])
            cursor.execute(d.max_row_version(record.name), [])
            if cursor.fetchone()[0] is not None:
                return False  # it holds messages: never dropped with them
            fresh = QueueRecord.objects.using(alias).filter(pk=record.pk).first()
            if fresh is None or not _idle(fresh, now):
                return False
            for sql, params in d.drop_queue_table(record.name):
                cursor.execute(sql, params)
        QueueRecord.objects.using(alias).filter(pk=record.pk).delete()
    registry.forget(record.name)
    return True
