"""Send, receive, peek, browse, delete and purge on queue tables.

Every statement comes from the dialect by name; this module only binds parameters
and turns rows into :class:`~core.messages.Message` values.  All calls run on the
Django connection of ``using`` (default ``SLUICE_DATABASE``) in whatever transaction
is open there, which is what makes "sends atomic with receive" work: a handler's
sends go through the same connection as the receive that delivered its message.
"""
from __future__ import annotations

import datetime as dt
import logging
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

from django.db import DatabaseError, connections, transaction

from core.conf import get_settings
from core.db import StatementCursor
from core.dialects import Dialect, dialect_for
from core.dialects.rows import MESSAGE_COLUMNS
from core.errors import PoisonMessage, UnknownQueue
from core.messages import Headers, Message, decode_headers, wire_time
# The names of a new message's checks and rows, where callers have always imported them.
from core.outgoing import (HOST, ID_NAMESPACE, MAX_MESSAGE_ID_LENGTH, MessageBuilder, OutgoingMessage,  # noqa: F401
                           column_value, encode_body, like_first, row_id_for, validate_columns, validate_message_id)
from core.queues import QueueInfo, create_queue, registry
from core.tracing import producing as tracing
from core.scheduling import DelayedMessage, DelayedMessageStore, delayed_store, resolve_due
from core.runtime.marks import receive_marks
from core.runtime.wakeups import notify_queue, on_commit_wake, queue_key, wake_hub
# QueueCounts: where callers have always imported it.
from core.transport.looking import QueueCounts, QueueLooking  # noqa: F401

log = logging.getLogger("sluice.transport")

#: A statement and its parameters (Transport.send_along's ``along``).
Statement = tuple[str, Sequence[Any]]

#: Where a received row's RowVersion is (the receive returns MESSAGE_COLUMNS, then the expired flag).
ROW_VERSION = MESSAGE_COLUMNS.index("RowVersion")

#: The most rows one purge statement deletes (SQL Server escalates past 5,000 row locks).
MAX_PURGE_BATCH = 4000


class Transport(MessageBuilder, QueueLooking):
    """Queue-table operations on one database alias.

    ``delayed`` is the store delayed sends go to (default: the process's configured
    store, :func:`core.scheduling.delayed_store`)."""

    def __init__(self, using: str | None = None, delayed: DelayedMessageStore | None = None) -> None:
        self.using = using or get_settings().DATABASE
        self._delayed = delayed

    @property
    def dialect(self) -> Dialect:
        return dialect_for(connections[self.using], get_settings().SCHEMA)

    @property
    def delayed(self) -> DelayedMessageStore:
        return self._delayed or delayed_store(self.using)

    def _cursor(self) -> StatementCursor:
        return StatementCursor(self.using)

    # -- inserting: every row goes in through enqueue() ----------------------------
    def enqueue(self, messages: Sequence[OutgoingMessage], along: Statement | None = None) -> tuple[Any, ...] | None:
        """Insert rows into their queue tables: THE insert path (send, send_many, the
        delayed mover, moves to the error / dead-letter queue, the outbox, failed-message
        retries all end here).

        One statement per queue, kind of expiry and chunk (the dialect's
        ``insert_rows``: unnest arrays on PostgreSQL, multi-row VALUES elsewhere within
        the parameter limit; or the dialect's ``copy_rows``: a COPY on PostgreSQL for a
        large group without a TTL), RowVersions in list order.  Expires is computed by the database (its now + the TTL),
        or kept as given (``OutgoingMessage.expires``).  Activity is recorded on each
        queue (after the transaction commits), so an idle temporary queue that just
        received a row is not dropped.

        ``along``: a statement of the caller's returning one row, run with the first
        insert in one round trip where the dialect can (``insert_along``), else right
        after the inserts; returns that row (None without ``along``).
        """
        groups: dict[tuple[str, bool], list[OutgoingMessage]] = {}
        along_row = None
        for m in messages:
            groups.setdefault((m.queue, m.ttl_seconds is not None), []).append(m)
        d = self.dialect
        with self._cursor() as cursor, self._queue_dropped_is_unknown(groups):
            for (queue, with_ttl), group in groups.items():
                # Tuples, not lists: the collector stops tracking a tuple of strings and
                # bytes at its first pass, so a large batch does not set off full
                # collections of the process's heap (a tenth of send_many's time).
                if with_ttl:
                    rows = [(m.row_id, m.correlation_id, m.reply_to, *d.ttl_params(m.ttl_seconds),
                             m.encoded_headers(), m.body) for m in group]
                else:
                    as_param = d.datetime_param
                    rows = [(m.row_id, m.correlation_id, m.reply_to, None if m.expires is None else as_param(m.expires),
                             m.encoded_headers(), m.body) for m in group]
                copy = None if along is not None else d.copy_rows(queue, len(rows), with_ttl)
                if copy is not None:
                    cursor.copy_in(copy, rows)
                    continue
                size = d.insert_rows_per_statement(len(rows[0]))
                for start in range(0, len(rows), size):
                    sql, params = d.insert_rows(queue, rows[start:start + size], with_ttl)
                    joined = None if along is None else d.insert_along(sql, along[0])
                    if joined is None:
                        cursor.execute(sql, params, prepare=True)
                    else:
                        cursor.execute(joined, [*params, *along[1]], prepare=True)
                        along_row, along = cursor.fetchone(), None
            if along is not None:
                along_row = cursor.execute(along[0], along[1], prepare=True).fetchone()
        names = sorted({queue for queue, _ in groups})
        for queue in names:
            registry.record_activity(queue, self.using)
        self._announce_on_commit(names, d)
        return along_row

    def _announce_on_commit(self, queues: Sequence[str], d: Dialect) -> None:
        """Once the rows are committed, wake the queues' pumps: this process's at once,
        other processes' through the debounced NOTIFY where the database has one
        (core.runtime.wakeups).  A rolled-back insert wakes no one."""
        notify_sql = d.notify() if d.supports_notify else None
        using = self.using

        def announce() -> None:
            for queue in queues:
                wake_hub.wake(queue_key(queue))
                if notify_sql is not None:
                    notify_queue(using, queue, notify_sql)

        on_commit_wake(announce, using, f"queue {', '.join(queues)}")

    @contextmanager
    def _queue_dropped_is_unknown(self, groups: Mapping[tuple[str, bool], Any]) -> Iterator[None]:
        """A queue dropped since this process cached its settings (an idle temporary queue,
        say): UnknownQueue, as for a queue that never existed, not a driver error."""
        try:
            yield
        except DatabaseError as exc:
            if not self.dialect.is_missing_table(exc):
                raise
            names = sorted({queue for queue, _ in groups})
            for name in names:
                registry.forget(name)
            raise UnknownQueue(f"queue {' or '.join(map(repr, names))} no longer exists") from exc

    def move(self, message: Message, queue: str, headers: Mapping[str, str], *, keep_expiry: bool = False) -> None:
        """Put a received message into ``queue`` with ``headers``: back into its own queue
        for an immediate retry (``keep_expiry``: same Expires), or into an error or
        dead-letter queue (no expiry).  Same Id and body."""
        self.enqueue([self.moved(message, queue, headers, keep_expiry=keep_expiry)])

    def move_to_holding(self, message: Message, queue: str, headers: Mapping[str, str], kind: str) -> None:
        """:meth:`move` into an error or dead-letter queue (``kind``), which Sluice owns:
        one found missing (dropped by hand, never set up) is recreated, with an ERROR in
        the log, rather than failing the receive batch that holds the message for ever.
        The move runs in a savepoint because a missing table aborts the transaction on
        PostgreSQL; it costs one round trip on a path only failures take."""
        try:
            with transaction.atomic(using=self.using):
                self.move(message, queue, headers)
            return
        except UnknownQueue:
            log.error("%s queue %s is missing: recreating it to take message %s from %s "
                      "(run `sluice setup` after dropping queues by hand)", kind, queue, message.id, message.queue)
        create_queue(queue, kind=kind, using=self.using)
        self.move(message, queue, headers)

    def moved(self, message: Message, queue: str, headers: Mapping[str, str], *,
              keep_expiry: bool = False) -> OutgoingMessage:
        """The row :meth:`move` inserts (for moving many with one :meth:`enqueue`)."""
        info = self._queue(queue)
        headers = dict(headers)
        if not keep_expiry:
            headers.pop(Headers.TIME_TO_BE_RECEIVED, None)
        return OutgoingMessage(
            queue=info.name, row_id=message.id, headers=headers, body=message.body,
            # Headers another system wrote were never validated: copy into the columns only
            # what they take (the headers keep the full values).
            correlation_id=column_value(headers.get(Headers.CORRELATION_ID, message.correlation_id)),
            reply_to=column_value(headers.get(Headers.REPLY_TO_ADDRESS, message.reply_to)), ttl_seconds=None,
            expires=message.expires if keep_expiry else None)

    def schedule(self, message: OutgoingMessage, delay: float | None, deliver_at: dt.datetime | None) -> None:
        """Put a built message into the delayed store instead of its queue (due after
        ``delay`` seconds by the store's clock, or at ``deliver_at``).  Its TTL starts
        when the mover puts it in the queue; the queue counts it as activity."""
        self.schedule_many([message], delay, deliver_at)

    def schedule_many(self, messages: Sequence[OutgoingMessage], delay: float | None,
                      deliver_at: dt.datetime | None) -> None:
        """:meth:`schedule` for several messages: one statement per chunk into a store
        that can (``store_many``), else one store call each."""
        estimate = deliver_at or dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=delay or 0)
        delayed = [DelayedMessage(id=m.message_id, destination=m.queue, body=m.body,
                                  headers={**m.headers, Headers.DELIVER_AT: wire_time(estimate)}, due=deliver_at)
                   for m in messages]
        store_many = getattr(self.delayed, "store_many", None)
        if store_many is not None and len(delayed) > 1:
            store_many(delayed, delay=delay)
        else:
            for message in delayed:
                self.delayed.store(message, delay=delay)
        for queue in sorted({m.queue for m in messages}):
            registry.record_activity(queue, self.using)

    # -- sending -------------------------------------------------------------------
    def send(self, queue: str, body: Any, *, delay: Any = None, deliver_at: Any = None, **options: Any) -> str:
        """Send one message (one INSERT; Expires from the database clock).  Returns its id.

        Options: message_type, headers, message_id, correlation_id, reply_to, ttl
        (seconds or timedelta), content_type.  ``delay`` (seconds or timedelta) or
        ``deliver_at`` (an aware datetime, or ISO 8601 text with an offset) put the
        message in the delayed store instead; its TTL starts when it lands in the queue.
        A zero delay or a time in the past sends at once.
        """
        return self.send_along(queue, body, None, delay=delay, deliver_at=deliver_at, **options)[0]

    def send_along(self, queue: str, body: Any, along: Statement | None, *, delay: Any = None,
                   deliver_at: Any = None, **options: Any) -> tuple[str, tuple[Any, ...] | None]:
        """:meth:`send`, and ``along`` (a statement of the caller's returning one row: a row
        that belongs with the message, such as a task's result) in the same transaction
        and, where the dialect can, in the same round trip (:meth:`enqueue`).  Returns
        the message's id and along's row."""
        wait, when = resolve_due(delay, deliver_at)
        with tracing.send_span(queue, delayed=wait is not None or when is not None) as span:
            message = self.build(queue, body, **options)
            if wait is None and when is None:
                row = self.enqueue([message], along)
            else:
                self.schedule(message, wait, when)
                row = None if along is None else self._run_along(along)
            if span is not None:
                tracing.sent(span, [message])
        return message.message_id, row

    def _run_along(self, along: Statement) -> tuple[Any, ...] | None:
        with self._cursor() as cursor:
            return cursor.execute(along[0], along[1], prepare=True).fetchone()

    def send_many(self, queue: str, bodies: Sequence[Any], *, delay: Any = None, deliver_at: Any = None,
                  **options: Any) -> list[str]:
        """Send several messages with the same options: one INSERT statement per chunk
        (see :meth:`enqueue`), RowVersions in list order, Expires from the database
        clock.  Returns their ids in order.  ``delay`` / ``deliver_at`` (for the whole
        batch) put them in the delayed store instead, as :meth:`send` does.  Inside
        ``transaction.atomic()`` the batch commits as a whole."""
        wait, when = resolve_due(delay, deliver_at)
        with tracing.send_span(queue, delayed=wait is not None or when is not None) as span:
            messages = self.build_many(queue, bodies, **options)
            if wait is None and when is None:
                self.enqueue(messages)
            else:
                self.schedule_many(messages, wait, when)
            if span is not None:
                tracing.sent(span, messages)
        return [m.message_id for m in messages]

    # -- receiving -------------------------------------------------------------
    def receive_batch(self, queue: str, limit: int) -> list[Message]:
        """Delete and return up to ``limit`` oldest messages no other receiver holds (on a
        dialect with ``supports_receive_mark``: the oldest from the queue's mark on, with a
        scan from the start now and then, core.runtime.marks).

        Inside ``transaction.atomic()`` the delete stays uncommitted until the block ends:
        a rollback puts the messages back.  Expired messages come back with
        ``expired=True`` (the database decides) and must not reach a handler.  Rows whose
        headers cannot be parsed come back with ``poison`` set.
        """
        info = self._queue(queue)
        d = self.dialect
        if not d.supports_receive_mark:
            with self._cursor() as cursor:
                rows = cursor.execute(d.receive(queue), [limit], prepare=True).fetchall()
            return self._received(info, queue, rows)
        # From the queue's mark, past the rows earlier receives deleted (core.runtime.marks).
        key = (self.using, queue, info.record_id)
        with self._cursor() as cursor:
            look = receive_marks.look(key)
            if look.start is None:
                rows = cursor.execute(d.receive(queue), [limit], prepare=True).fetchall()
            else:
                rows = cursor.execute(d.receive_from(queue), d.receive_from_params(look.start, limit),
                                      prepare=True).fetchall()
            receive_marks.received(key, look, min((int(raw[ROW_VERSION]) for raw in rows), default=None))
        return self._received(info, queue, rows)

    def _received(self, info: QueueInfo, queue: str, rows: list[tuple[Any, ...]]) -> list[Message]:
        d = self.dialect
        messages = sorted((self.to_message(queue, d.to_row(raw)) for raw in rows), key=lambda m: m.row_version)
        if messages:
            registry.record_activity(info.name, self.using)
        return messages

    def receive(self, queue: str) -> Message | None:
        batch = self.receive_batch(queue, 1)
        return batch[0] if batch else None

    def to_message(self, queue: str, row) -> Message:
        """A Message from a normalised row (headers parsed; poison when they cannot be)."""
        try:
            headers, poison = decode_headers(row.headers), None
        except PoisonMessage as exc:
            headers, poison = {}, str(exc)
        return Message(row.id, headers, row.body, queue, row.row_version, row.expires, row.expired,
                       row.correlation_id, row.reply_to, row.headers, poison)

    # -- removing -------------------------------------------------------------
    def delete(self, queue: str, message_id: str) -> bool:
        """Delete one message by id; False when it is not there or a receiver holds it."""
        self._queue(queue)
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delete_by_id(queue), [row_id_for(message_id)])
            return cursor.rowcount > 0

    def purge(self, queue: str, expired_only: bool = False, batch_size: int | None = None,
              max_batches: int | None = None) -> int:
        """Delete messages in batches (each its own transaction), skipping rows receivers
        hold.  Batches are capped at :data:`MAX_PURGE_BATCH` rows: more row locks than
        that and SQL Server escalates to a lock on the whole table.  Returns how many
        were deleted."""
        self._queue(queue)
        size = min(batch_size or get_settings().PURGE_BATCH_SIZE, MAX_PURGE_BATCH)
        sql = self.dialect.purge_expired(queue) if expired_only else self.dialect.purge_all(queue)
        total = batches = 0
        while max_batches is None or batches < max_batches:
            with self._cursor() as cursor:
                cursor.execute(sql, [size])
                deleted = max(cursor.rowcount, 0)
            total += deleted
            batches += 1
            if deleted < size:
                break
        if total:
            log.info("purged %d %smessages from %s", total, "expired " if expired_only else "", queue)
        return total
