"""Named SQL of per-queue limits (core/runtime/limits.py): mixed into every dialect.

A receive of a limited queue locks, in its own transaction and before it takes messages,
one concurrency slot row and as many ticket rows as messages it may take; other receivers
pass over locked rows (the dialect's skip-locked fragments), so they never wait for one.
Where one writer at a time serialises receives (:attr:`Dialect.supports_concurrent_writers`
False: SQLite) no slot is taken at all and the fragments are empty."""
from __future__ import annotations

SLOT_TABLE = "sluice_queue_slot"
TICKET_TABLE = "sluice_queue_ticket"


class LimitsSQL:
    """The limits' statements; fragments and helpers come from :class:`Dialect`."""

    #: SQL expression: the database's clock one second ago (a ticket used before it is free).
    one_second_ago: str = ""

    def take_slot(self) -> str:
        """One free slot of a queue (params: queue, concurrency, 1), locked until the
        transaction ends; no row when every slot is held."""
        q = self.quote  # type: ignore[attr-defined]
        return (f"SELECT {q('slot')} FROM {q(SLOT_TABLE)}{self.lock_skip_hint} "  # type: ignore[attr-defined]
                f"WHERE {q('queue')} = %s AND {q('slot')} <= %s "
                f"ORDER BY {q('slot')}{self.limit}{self.skip_locked_suffix}")  # type: ignore[attr-defined]

    def take_tickets(self) -> str:
        """Up to %s free tickets of a queue (params: queue, rate, how many), locked until
        the transaction ends: those not used within the last second."""
        q = self.quote  # type: ignore[attr-defined]
        return (f"SELECT {q('ticket')} FROM {q(TICKET_TABLE)}{self.lock_skip_hint} "  # type: ignore[attr-defined]
                f"WHERE {q('queue')} = %s AND {q('ticket')} <= %s AND {q('used_at')} <= {self.one_second_ago} "
                f"ORDER BY {q('ticket')}{self.limit}{self.skip_locked_suffix}")  # type: ignore[attr-defined]

    def use_tickets(self, count: int) -> str:
        """Mark ``count`` tickets used now, at the end of the transaction that took them
        (params: queue, then the ticket numbers): each is free again one second after the
        last message it let through was handled, so no second holds more than R handler
        starts.  A rollback leaves them as they were."""
        q = self.quote  # type: ignore[attr-defined]
        marks = ", ".join(["%s"] * count)
        return (f"UPDATE {q(TICKET_TABLE)} SET {q('used_at')} = {self.now_sql()} "  # type: ignore[attr-defined]
                f"WHERE {q('queue')} = %s AND {q('ticket')} IN ({marks})")

    def next_ticket(self) -> str:
        """One row: when the queue's longest-unused ticket was used, and the database's
        now (params: queue, rate): the wait for a ticket, by the database's clock."""
        q = self.quote  # type: ignore[attr-defined]
        return (f"SELECT MIN({q('used_at')}), {self.now_sql()} FROM {q(TICKET_TABLE)} "  # type: ignore[attr-defined]
                f"WHERE {q('queue')} = %s AND {q('ticket')} <= %s")
