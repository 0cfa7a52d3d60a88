"""The outbox of one database alias: phase 1 inside the caller's transaction, phase 2
after its commit (core.outbox.dispatch), and the retention clean-up."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from django.db import transaction

from core.conf import get_settings
from core.outbox.dispatch import DISPATCH_LEASE_SECONDS, DispatchReport, Phase2
from core.outbox.operations import EMPTY_OPERATIONS
from core.outbox.sender import OutboxSender
from core.outbox.store import OutboxConflict, OutboxStore

log = logging.getLogger("sluice.outbox")


@dataclass(frozen=True)
class Phase1Result:
    #: The message had been processed before (or a concurrent copy won): handler skipped.
    duplicate: bool
    #: The record may have operations left to dispatch: run phase 2 after the commit.
    needs_dispatch: bool


class Outbox:
    """Phase 1 and phase 2 on one database alias's outbox table."""

    def __init__(self, using: str | None = None, table: str | None = None,
                 concurrency_control: str | None = None) -> None:
        s = get_settings()
        self.store = OutboxStore(using, table)
        self.using = self.store.using
        self.pessimistic = (concurrency_control or s.OUTBOX_CONCURRENCY_CONTROL) == "pessimistic"
        #: Seconds a phase-2 claim keeps other dispatchers off a record (core.outbox.dispatch).
        self.dispatch_lease = DISPATCH_LEASE_SECONDS

    # -- phase 1: inside the caller's transaction --
    def phase1(self, message_id: str, handler: Callable[[OutboxSender], Any],
               known: dict[str, tuple[bool, bool]] | None = None) -> Phase1Result:
        """De-duplicate, run ``handler(sender)`` and store its operations — in a savepoint of
        the open transaction, so a failure rolls back only this message's work (and
        propagates, for the pump's recoverability).

        ``known``: record states looked up for a whole receive batch at once (see
        :meth:`OutboxStore.states`); updated here with the record this call stores, so a
        second copy in the same batch is recognised too.  Copies committed by others
        after the look-up are still caught by the primary key."""
        sender = OutboxSender(self.using)
        try:
            with transaction.atomic(using=self.using):
                state = known.get(message_id) if known is not None else self.store.state(message_id)
                if state is not None:
                    return Phase1Result(duplicate=True, needs_dispatch=not state[0])
                if self.pessimistic:
                    self.store.insert(message_id, EMPTY_OPERATIONS, dispatched=False)
                sender.anchor()
                handler(sender)
                done = not sender.operations
                if self.pessimistic:
                    self.store.store_operations(message_id, sender.encode(), dispatched=done)
                else:
                    self.store.insert(message_id, sender.encode(), dispatched=done)
        except OutboxConflict:
            if known is not None:
                known[message_id] = (False, False)
            # A concurrent copy stored the record first (and committed: its lock made us wait).
            return Phase1Result(duplicate=True, needs_dispatch=True)
        if known is not None:
            known[message_id] = (not sender.operations, False)
        return Phase1Result(duplicate=False, needs_dispatch=bool(sender.operations))

    # -- phase 2: after the commit --
    def after_commit(self, message_ids: list[str]) -> DispatchReport | None:
        """Phase 2 right after phase 1 committed.  Never raises: whatever it cannot finish
        stays undispatched for the background dispatcher."""
        try:
            return self.dispatch(message_ids)
        except Exception:
            log.warning("outbox phase 2 for %d record(s) failed; the dispatcher will finish it",
                        len(message_ids), exc_info=True)
            return None

    def dispatch(self, message_ids: Iterable[str], *, include_quarantined: bool = False) -> DispatchReport:
        """Dispatch the operations of undispatched records and mark them dispatched (claim,
        publish, mark: see core.outbox.dispatch).  A record that cannot be dispatched (its
        destination is gone, another database is down) keeps its LastError and stays
        undispatched without holding the others back; one whose operations cannot be read
        is quarantined: kept, shown by ``sluice outbox list``, never dropped."""
        report = DispatchReport()
        Phase2(self.store, self.dispatch_lease).run(list(dict.fromkeys(message_ids)), include_quarantined, report)
        return report

    # -- retention --
    def cleanup(self, keep_seconds: float | None = None, batch_size: int | None = None,
                max_batches: int | None = None) -> int:
        """Delete dispatched records older than the retention, in batches (each its own
        transaction, skipping locked rows).  Undispatched records are never deleted."""
        s = get_settings()
        keep = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR if keep_seconds is None else keep_seconds
        size = batch_size or s.OUTBOX_CLEANUP_BATCH_SIZE
        total = batches = 0
        while max_batches is None or batches < max_batches:
            deleted = self.store.cleanup_batch(keep, size)
            total += deleted
            batches += 1
            if deleted < size:
                break
        if total:
            log.info("outbox clean-up deleted %d record(s) from %s", total, self.store.table)
        return total
