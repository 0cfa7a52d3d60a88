"""The SQL delayed-message store: one table per endpoint (default ``<endpoint>_delayed``;
Id, Destination, State, Time, Headers, RetryCount, index on Time) in the Sluice
database, any dialect.  Due times come from the database clock."""
from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction

from core.runtime.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.db import StatementCursor
from core.delayed.wake import NOTIFY_CHANNEL, notify_payload, on_commit_wake, wake_hub
from core.dialects import Dialect, dialect_for
from core.errors import Unavailable
from core.messages import decode_headers, encode_headers
from core.queues import validate_name
from core.scheduling import DelayedMessage

log = logging.getLogger("sluice.delayed")


@dataclass(frozen=True)
class DueClaim:
    """What :meth:`SqlDelayedStore.claim` took, earliest first, and what the store said
    in the same statement where it can: the earliest due time left (None: nothing is
    left) and its now.  ``now`` None: the store did not say (ask :meth:`next_and_now`)."""

    messages: list[DelayedMessage]
    next_due: dt.datetime | None
    now: dt.datetime | None


class DelayedStoreUnavailable(Unavailable):
    """The store failed just now and pauses, as its circuit breaker asks, before the next try."""


class SqlDelayedStore:
    """The delayed store in a table of the Sluice database (any dialect)."""

    def __init__(self, using: str | None = None, table: str | None = None) -> None:
        settings = get_settings()
        self.using = using or settings.DATABASE
        self.table = validate_name(table or settings.delayed_table, own_table=True)
        #: The table of the old default name ("<endpoint>.delayed") that setup renames.
        self.legacy_table = None if (table or settings.DELAYED_TABLE) else f"{settings.ENDPOINT}.delayed"
        self.store_breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"delayed-store:{self.table}", settings.TIME_TO_TRIGGER_STORE_BREAKER)
        self._paused_until = 0.0  # monotonic

    @property
    def dialect(self) -> Dialect:
        return dialect_for(connections[self.using], get_settings().SCHEMA)

    def _cursor(self):
        return connections[self.using].cursor()

    def setup_infrastructure(self) -> None:
        """Create the table and its index.  A table of the old default name
        (``<endpoint>.delayed``, which read like a schema-qualified name) is renamed to
        the new one, its messages kept, when the new one does not exist yet."""
        d = self.dialect
        with transaction.atomic(using=self.using), self._cursor() as cursor:
            lock = d.ddl_lock()
            if lock:
                cursor.execute(*lock)
            if self.legacy_table and self._exists(cursor, self.legacy_table):
                if self._exists(cursor, self.table):
                    log.warning("both %s and the old %s exist; the old table is left alone (move its "
                                "rows by hand, then drop it)", self.table, self.legacy_table)
                else:
                    for sql, params in d.rename_delayed_table(self.legacy_table, self.table):
                        cursor.execute(sql, params)
                    log.warning("renamed the delayed store %s to %s", self.legacy_table, self.table)
            for sql, params in d.create_delayed_table(self.table):
                cursor.execute(sql, params)

    def _exists(self, cursor, table: str) -> bool:
        cursor.execute(*self.dialect.table_exists(table))
        return cursor.fetchone() is not None

    # -- storing ---------------------------------------------------------------------
    def store(self, message: DelayedMessage, delay: float | None = None) -> bool:
        """Store ``message`` under its id; False (logged, nothing changed) when that id is
        stored already: the first is kept.  Delayed retries have keys of their own
        (core.receive.recoverability.retry_key), so only a re-sent message can collide."""
        d = self.dialect
        headers = encode_headers(message.headers)
        if delay is not None:
            sql = d.delayed_insert_after(self.table)
            params = d.delayed_insert_params(message.id, message.destination, message.body,
                                             d.ttl_params(delay), headers)
        else:
            sql = d.delayed_insert_at(self.table)
            params = d.delayed_insert_params(message.id, message.destination, message.body,
                                             [d.datetime_param(message.due)], headers)
        dues = self._insert([(sql, params)])
        if not dues:
            log.info("delayed message %s is already stored; kept the first", message.id)
            return False
        message.due = dues[0]
        return True

    def store_many(self, messages: list[DelayedMessage], delay: float | None = None) -> int:
        """Store messages due after ``delay`` seconds (by the database clock), or each at
        its own ``due``: one statement per chunk (within the dialect's parameter limit).
        Ids already stored are skipped.  Returns how many were stored."""
        d = self.dialect
        rows = [(m.id, m.destination, m.body,
                 d.ttl_params(delay) if delay is not None else [d.datetime_param(m.due)],
                 encode_headers(m.headers)) for m in messages]
        if not rows:
            return 0
        size = max(1, d.max_parameters // (4 + len(rows[0][3])))
        statements = [(d.delayed_insert_many(self.table, len(chunk), after=delay is not None),
                       d.delayed_insert_many_params(chunk))
                      for chunk in (rows[i:i + size] for i in range(0, len(rows), size))]
        return len(self._insert(statements))

    def _insert(self, statements: list[tuple[str, list[Any]]]) -> list[dt.datetime]:
        """Run the store's inserts in one transaction; the stored due times.  Movers are
        woken for the earliest (NOTIFY in the transaction, the hub at commit); failures
        count toward the store's breaker, whose pause is honoured by failing fast."""
        d = self.dialect
        wait = self._paused_until - time.monotonic()
        if wait > 0:
            raise DelayedStoreUnavailable(
                f"the delayed store {self.table} is pausing {wait:.1f} s after failing "
                f"({self.store_breaker.last_error}); the message was not stored")
        dues: list[dt.datetime] = []
        try:
            with transaction.atomic(using=self.using), self._cursor() as cursor:
                for sql, params in statements:
                    cursor.execute(sql, params)
                    dues += [d.to_datetime(row[0]) for row in cursor.fetchall()]
                if dues:
                    first = min(dues).timestamp()
                    if d.supports_notify:
                        cursor.execute(d.notify(), [NOTIFY_CHANNEL, notify_payload(self.table, first)])
                    on_commit_wake(lambda: wake_hub.wake(self.table, first), self.using, f"movers of {self.table}")
        except DatabaseError as exc:
            # The pause the breaker asks for is honoured by failing fast until it ends:
            # sleeping here would hold the caller's transaction (a pump's batch) open.
            self._paused_until = time.monotonic() + self.store_breaker.failure(exc)
            raise
        self.store_breaker.success()
        return dues

    # -- the mover's side --------------------------------------------------------------------
    def _message(self, raw: tuple[Any, ...]) -> DelayedMessage:
        id_, destination, state, when, headers, retry_count = raw[:6]
        d = self.dialect
        text = headers if isinstance(headers, str) else bytes(headers).decode("utf-8", "replace")
        try:
            parsed = decode_headers(text)
            poison = None
        except Exception as exc:  # noqa: BLE001 — kept raw, sent to the error queue by the mover
            parsed, poison = {}, str(exc)
        message = DelayedMessage(id=str(id_), destination=destination, body=bytes(state or b""),
                                 headers=parsed, due=d.to_datetime(when), retry_count=int(retry_count))
        if poison:
            message.extra.update(poison=poison, raw_headers=text)
        return message

    def fetch_due(self, limit: int, at: dt.datetime | None = None) -> list[DelayedMessage]:
        """Up to ``limit`` due messages, earliest first, locked until the transaction ends.
        ``at`` None means the database's own now."""
        d = self.dialect
        # The mover's statements run many times a second: prepared where the database can.
        with StatementCursor(self.using) as cursor:
            cursor.execute(d.delayed_fetch_due(self.table), d.delayed_fetch_params(d.datetime_param(at), limit),
                           prepare=True)
            return [self._message(raw) for raw in cursor.fetchall()]

    def claim_due(self, limit: int) -> list[DelayedMessage]:
        """Take up to ``limit`` messages due by the database's clock out of the store in
        one statement, earliest first: deleted here, put in their queues by the caller
        in the same transaction, whose rollback puts them back.  The mover's fast path —
        one round trip where :meth:`fetch_due` and :meth:`remove_many` take two."""
        return self.claim(limit).messages

    def claim(self, limit: int) -> DueClaim:
        """:meth:`claim_due`, and where the dialect can say it in the same statement
        (``supports_claim_with_next``), when the next message left is due and the
        database's now — what the mover asks next, one round trip fewer."""
        d = self.dialect
        with_next = d.supports_claim_with_next
        sql = d.delayed_claim_due_and_next(self.table) if with_next else d.delayed_claim_due(self.table)
        with StatementCursor(self.using) as cursor:
            cursor.execute(sql, d.delayed_claim_params(None, limit), prepare=True)
            rows = cursor.fetchall()
        if not with_next:
            claimed = [self._message(raw) for raw in rows]
            nxt = now = None
        else:
            claimed = [self._message(raw[:-2]) for raw in rows if raw[0] is not None]
            nxt, now = d.to_datetime(rows[0][-2]), d.to_datetime(rows[0][-1])
        claimed.sort(key=lambda message: message.due)  # a DELETE returns rows in no set order
        return DueClaim(claimed, nxt, now)

    def fetch_next_due(self, at: dt.datetime) -> DelayedMessage | None:
        batch = self.fetch_due(1, at)
        return batch[0] if batch else None

    def remove(self, message: DelayedMessage) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_remove(self.table), [message.id])
            return cursor.rowcount == 1

    def remove_many(self, messages: list[DelayedMessage]) -> int:
        """Forget forwarded messages, in as few statements as the database's parameter
        limit allows; returns how many were there."""
        d = self.dialect
        removed = 0
        with self._cursor() as cursor:
            for start in range(0, len(messages), d.max_parameters):
                chunk = messages[start:start + d.max_parameters]
                cursor.execute(d.delayed_remove_many(self.table, len(chunk)), [m.id for m in chunk])
                removed += cursor.rowcount
        return removed

    def increment_failure_count(self, message: DelayedMessage) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_increment_failure(self.table), [message.id])
            return cursor.rowcount == 1

    def next_and_now(self) -> tuple[dt.datetime | None, dt.datetime]:
        """(earliest due time or None, the database's now) in one round trip."""
        d = self.dialect
        with StatementCursor(self.using) as cursor:
            cursor.execute(d.delayed_next(self.table), [], prepare=True)
            nxt, now = cursor.fetchone()
        return d.to_datetime(nxt), d.to_datetime(now)

    def next(self) -> dt.datetime | None:
        return self.next_and_now()[0]

    # -- operators ----------------------------------------------------------------------
    def list(self, limit: int = 1000, bodies: bool = True) -> tuple[list[DelayedMessage], dt.datetime]:
        """Stored messages by due time, and the database's now (to tell due from scheduled).
        ``bodies=False`` (the dashboard's listings): each ``body`` is empty and
        ``extra["size"]`` holds its size in bytes, so a page never reads 1,000 bodies."""
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.delayed_list(self.table, bodies), [limit])
            rows = cursor.fetchall()
            if rows:
                now = d.to_datetime(rows[0][6])
            else:
                cursor.execute(d.delayed_next(self.table), [])
                now = d.to_datetime(cursor.fetchone()[1])
        return [self._message(raw) if bodies else self._listed(raw) for raw in rows], now

    def _listed(self, raw: tuple[Any, ...]) -> DelayedMessage:
        """A row of :meth:`list` without bodies: its State column holds the body's size."""
        message = self._message((*raw[:2], None, *raw[3:]))
        message.extra["size"] = int(raw[2] or 0)
        return message

    def deliver_now(self, message_id: str) -> bool:
        d = self.dialect
        with transaction.atomic(using=self.using), self._cursor() as cursor:
            cursor.execute(d.delayed_deliver_now(self.table), [message_id])
            found = cursor.rowcount == 1
            if found and d.supports_notify:
                cursor.execute(d.notify(), [NOTIFY_CHANNEL, notify_payload(self.table, 0.0)])
            if found:
                on_commit_wake(lambda: wake_hub.wake(self.table, 0.0), self.using, f"movers of {self.table}")
        return found

    def has_destination(self, queue: str) -> bool:
        """Whether some stored message is for ``queue`` (it keeps a temporary queue alive)."""
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_has_destination(self.table), [queue])
            return cursor.fetchone() is not None

    def delete(self, message_id: str) -> bool:
        with self._cursor() as cursor:
            cursor.execute(self.dialect.delayed_remove(self.table), [message_id])
            return cursor.rowcount == 1
