"""A limited queue's receive asks for a permit first (core.runtime.limits: the limits, and
why the database enforces them).

Inside the receive's transaction, before the receive statement, :meth:`Permit.take`:

- locks one free concurrency slot row, where receives can run at once (with one writer at
  a time, SQLite, the receive's transaction already holds the database's only write lock
  while its handlers run: no two of them handle at once, in any process, so no slot is
  needed and none is taken);
- locks up to as many free ticket rows as messages wanted, and lowers the receive to that.

A receive handles its messages one after the other, so one slot is one message at a time
(a batch handler's call counts as one).  Just before the transaction commits,
:meth:`Permit.spend` marks the tickets of the messages taken as used now, so a ticket lets
through at most one handler start per second.  Rows others hold are passed over, never
waited for; when nothing is free the receive takes nothing and the pump waits
:attr:`Permit.wait` seconds, as on an empty queue.
"""
from __future__ import annotations

from django.db import connections

from core.queues import dialect
from core.runtime.limits import Limits

#: The longest wait for a slot (a slot held in another process frees without a wake-up);
#: also the wait for a ticket some other receive holds, which it marks at its commit.
SLOT_WAIT = 0.1


class Permit:
    """One receive's claim on a limited queue's slot and tickets (module doc)."""

    __slots__ = ("limits", "tickets", "wait", "allowed")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.tickets: list[int] = []
        #: What :meth:`take` allowed: a receive that took that many took a full batch.
        self.allowed = 0
        #: Seconds to wait when :meth:`take` found nothing free (0: it did not refuse).
        self.wait = 0.0

    def take(self, alias: str, want: int) -> int:
        """How many messages this receive may take (0: none; :attr:`wait` says how long
        to wait), with the rows that allow it locked until the transaction ends."""
        d = dialect(alias)
        queue, concurrency, rate = self.limits.queue, self.limits.concurrency, self.limits.rate
        with connections[alias].cursor() as cursor:
            if concurrency is not None and d.supports_concurrent_writers:
                cursor.execute(d.take_slot(), [queue, concurrency, 1])
                if cursor.fetchone() is None:
                    self.wait = SLOT_WAIT
                    return 0
            if rate is None:
                self.allowed = want
                return want
            cursor.execute(d.take_tickets(), [queue, rate, min(want, rate)])
            self.tickets = [row[0] for row in cursor.fetchall()]
            if not self.tickets:
                self.wait = self._ticket_wait(cursor, d)
                return 0
        self.allowed = len(self.tickets)
        return self.allowed

    def _ticket_wait(self, cursor, d) -> float:
        """Until the longest-unused ticket is a second old, by the database's clock."""
        cursor.execute(d.next_ticket(), [self.limits.queue, self.limits.rate])
        row = cursor.fetchone()
        oldest, now = (d.to_datetime(row[0]), d.to_datetime(row[1])) if row else (None, None)
        if oldest is None or now is None:
            return SLOT_WAIT
        left = 1.0 - (now - oldest).total_seconds()
        # A free ticket another receive holds (left <= 0) is marked at its commit: look again soon.
        return min(1.0, left) if left > 0.001 else SLOT_WAIT

    def spend(self, alias: str, taken: int) -> None:
        """The receive took ``taken`` messages: mark that many of its tickets used now (the
        others stay as they were and come back at the commit)."""
        if not taken or not self.tickets:
            return
        used = self.tickets[:taken]
        d = dialect(alias)
        with connections[alias].cursor() as cursor:
            cursor.execute(d.use_tickets(len(used)), [self.limits.queue, *used])
