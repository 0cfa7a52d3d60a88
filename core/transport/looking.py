"""Looking at queue tables without taking from them: peek, browse, counts.

:class:`QueueLooking` is part of :class:`core.transport.Transport` (which supplies the
queue look-up, the dialect, the cursor and the row-to-message step); apart here because
none of it sends or receives.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.db import StatementCursor
from core.dialects import Dialect
from core.messages import Message
from core.queues import QueueInfo, registry
from core.runtime.marks import receive_marks


@dataclass(frozen=True)
class QueueCounts:
    total: int
    expired: int
    #: False where the dialect counts without locks (SQL Server's NOLOCK): uncommitted
    #: sends and receives may be counted.
    exact: bool = True

    @property
    def pending(self) -> int:
        return self.total - self.expired


class QueueLooking:
    """Peek, browse and count the queue tables of the database alias ``using``."""

    using: str

    if TYPE_CHECKING:  # what Transport supplies
        @property
        def dialect(self) -> Dialect: ...

        def _queue(self, name: str) -> QueueInfo: ...

        def _cursor(self) -> StatementCursor: ...

        def to_message(self, queue: str, row: Any) -> Message: ...

    def peek_estimate(self, queue: str, *, from_mark: bool = False) -> int:
        """Roughly how many messages wait (max − min RowVersion); never counts rows.

        ``from_mark``: a pump's look before it receives, on a dialect with
        ``supports_receive_mark`` from the queue's mark as its receive scans (an idle queue
        under a held horizon is then not a walk over every row delivered since), and from
        the start when the receive's schedule has a full scan due; that scan moves the mark
        back to rows that became visible below it, so the receive after it finds them."""
        info = self._queue(queue)
        registry.record_activity(info.name, self.using)  # a listening pump keeps a temporary queue alive
        d = self.dialect
        with self._cursor() as cursor:
            if not (from_mark and d.supports_receive_mark):
                cursor.execute(d.peek_estimate(queue), [], prepare=True)
                return max(int(cursor.fetchone()[0] or 0), 0)
            key = (self.using, queue, info.record_id)
            look = receive_marks.look(key)
            sql, params = (d.peek_range(queue), []) if look.start is None else \
                (d.peek_range(queue, from_mark=True), [look.start, look.start])
            low, high = cursor.execute(sql, params, prepare=True).fetchone()
            receive_marks.received(key, look, None if low is None else int(low))
        # Both ends or neither, and high ≥ low, where the two reads share one snapshot; SQL
        # Server reads each without locks, so a receive between them can leave one end.
        return 0 if low is None or high is None else max(int(high) - int(low) + 1, 0)

    def browse(self, queue: str, limit: int = 50, after: int = 0) -> list[Message]:
        """Messages in FIFO order without taking them (skips rows receivers hold)."""
        d = self.dialect
        return [self.to_message(queue, d.to_row(raw)) for raw in self._browse(queue, d.browse(queue), limit, after)]

    def browse_sizes(self, queue: str, limit: int = 50, after: int = 0) -> list[tuple[Message, int]]:
        """:meth:`browse` without the bodies: (message with an empty body, body size in bytes).
        What a listing reads, so that a page of 4 MiB messages stays a page of headers."""
        d = self.dialect
        rows = self._browse(queue, d.browse_sizes(queue), limit, after)
        return [(self.to_message(queue, d.to_row((*raw[:5], b"", *raw[6:]))), int(raw[5] or 0)) for raw in rows]

    def _browse(self, queue: str, sql: str, limit: int, after: int) -> list[tuple[Any, ...]]:
        info = self._queue(queue)
        with self._cursor() as cursor:
            cursor.execute(sql, self.dialect.browse_params(after, limit))
            rows = cursor.fetchall()
        registry.record_activity(info.name, self.using)
        return rows

    def counts(self, queue: str) -> QueueCounts:
        """Total and expired counts (an operator's view; the pump uses peek_estimate):
        exact where the dialect's are (``QueueCounts.exact``)."""
        self._queue(queue)
        d = self.dialect
        with self._cursor() as cursor:
            cursor.execute(d.counts(queue), [])
            total, expired = cursor.fetchone()
        return QueueCounts(int(total), int(expired), d.counts_are_exact)
