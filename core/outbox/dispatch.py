"""Phase 2: dispatch the operations of undispatched records, with no lock held while
anything leaves the database.

For each chunk of records:

1. **Claim** (a transaction of its own, committed at once): set each record's
   DispatchingUntil to the database's now + a short lease.  Records another dispatcher
   holds or has leased are passed over.  (A chunk whose operations all stay in this
   database has nothing to publish: it is claimed, inserted and marked in one transaction.)
2. **Publish** the record's *external* operations — Celery tasks, queues in other
   databases — with no transaction open on the outbox's database (no row lock, and on
   SQLite no database write lock, is held over the network).
3. **Mark** (one transaction): mark it dispatched — only if this claim's lease still
   holds it (a compare-and-set on the claim's token) — and insert the record's operations
   on this database (its queues and delayed store), together.  They happen exactly once
   whatever the timing: a dispatcher that outlived its lease and was taken over marks
   nothing and inserts nothing; it says so in the log and leaves the record to the other.
   One that sees its lease run out while publishing stops publishing.

A crash (or a failed mark) between 2 and 3 leaves the record undispatched and leased;
when the lease runs out, the next dispatcher publishes the external operations again,
*with the same message ids and Celery task ids*.  Who absorbs the copy:

- a queue in another database: the receiving endpoint's outbox (its phase 1 finds the
  message id and skips the handler) — a receiver without an outbox processes it twice;
- a Celery task: the task id, the task's idempotency key (it sees ``self.request.id``
  again; run its work in ``OutboxSession(message_id=f"task-{self.request.id}")``, or
  check it some other way, to do it once).
"""
from __future__ import annotations

import base64
import datetime as dt
import logging
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, ContextManager

from django.db import transaction

from core.outbox.destinations import destination, require_alias
from core.outbox.operations import QUEUE, UnreadableOperations, decode_operations, is_delayed
from core.outbox.store import OutboxStore
from core.tracing import producing as tracing
from core.transport import OutgoingMessage, Transport

log = logging.getLogger("sluice.outbox")

#: Records claimed by one phase-2 chunk.
DISPATCH_CHUNK = 100
#: Seconds a claim keeps other dispatchers off a record while its operations are published.
DISPATCH_LEASE_SECONDS = 30.0


@dataclass
class DispatchReport:
    dispatched: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)
    #: Records left to another dispatcher: this one's lease ran out before it marked them
    #: (or before it could record their failure).
    lost: list[str] = field(default_factory=list)


@dataclass
class _Record:
    message_id: str
    age_s: float
    #: Operations that land in the outbox's own database (inserted with the mark).
    local: list[dict[str, Any]]
    #: Everything else: published before the mark, outside any transaction here.
    external: list[dict[str, Any]]


@dataclass(frozen=True)
class _Lease:
    """One claim: its token (every state change it makes is conditional on it) and when
    it ends by this process's clock — started before the claim, so never later than the
    database's end of it."""

    token: str
    ends: float


class _OperationFailed(Exception):
    """A record's own operation failed while it was marked (not the outbox table)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")


class Phase2:
    """Claim, publish, mark for the outbox table of ``store``."""

    def __init__(self, store: OutboxStore, lease_seconds: float = DISPATCH_LEASE_SECONDS) -> None:
        self.store = store
        self.using = store.using
        self.lease_seconds = lease_seconds

    def run(self, message_ids: list[str], include_quarantined: bool, report: DispatchReport) -> None:
        for start in range(0, len(message_ids), DISPATCH_CHUNK):
            chunk = message_ids[start:start + DISPATCH_CHUNK]
            lease = _Lease(uuid.uuid4().hex, time.monotonic() + self.lease_seconds)
            with transaction.atomic(using=self.using):
                records = self._claim(chunk, lease, include_quarantined, report)
                if not any(record.external for record in records):
                    # Nothing leaves the database: claim, insert and mark in one transaction.
                    with self._span(records):
                        self._mark(records, lease, report)
                    continue
            # The lease is committed: publish with no transaction open here, then mark.
            with self._span(records):
                self._mark(self._publish_all(records, lease, report), lease, report)

    def _span(self, records: list[_Record]) -> ContextManager[Any]:
        """The dispatch's span, linked to the context each queue operation captured when
        its record was written (nothing while tracing is off)."""
        return tracing.dispatch_span(self.store.table, len(records),
                                     (op["headers"] for record in records for op in record.local + record.external
                                      if op.get("kind") == QUEUE))

    # -- 1. claim --
    def _claim(self, ids: list[str], lease: _Lease, include_quarantined: bool,
               report: DispatchReport) -> list[_Record]:
        claimed = self.store.claim(ids, self.lease_seconds, lease.token, include_quarantined)
        records = []
        for row in claimed:
            try:
                operations = decode_operations(row.operations)
            except UnreadableOperations as exc:
                self._fail(row.message_id, f"quarantined: {exc}", lease, report, quarantine=True)
                log.error("outbox record %s quarantined: %s", row.message_id, exc)
                continue
            local = [op for op in operations if self._is_local(op)]
            records.append(_Record(row.message_id, row.age_s, local,
                                   [op for op in operations if not self._is_local(op)]))
        return records

    def _is_local(self, op: dict[str, Any]) -> bool:
        return op["kind"] == QUEUE and op.get("using") in (None, self.using)

    # -- 2. publish --
    def _publish_all(self, records: list[_Record], lease: _Lease, report: DispatchReport) -> list[_Record]:
        """Publish record by record while the lease lasts; the records ready to mark.

        A record is started only if it, as slow as the slowest so far, and the mark would
        still fit in the lease: past it another dispatcher may take the chunk, and two
        that keep outliving their leases would take it from each other forever.  The rest
        is left to the next dispatcher (or scan)."""
        ready: list[_Record] = []
        slowest = 0.0
        for index, record in enumerate(records):
            started = time.monotonic()
            if ready and started + slowest + self._mark_margin >= lease.ends:
                left = [r.message_id for r in records[index:]]
                report.lost.extend(left)
                log.warning("outbox: the %g s dispatch lease would run out while publishing; stopped, "
                            "leaving %d record(s) to the next dispatcher: %s", self.lease_seconds, len(left),
                            ", ".join(left))
                break
            if self._publish(record, lease, report):
                ready.append(record)
            slowest = max(slowest, time.monotonic() - started)
        return ready

    @property
    def _mark_margin(self) -> float:
        """Time kept back for the mark at the end of a lease."""
        return min(1.0, self.lease_seconds / 10)

    def _publish(self, record: _Record, lease: _Lease, report: DispatchReport) -> bool:
        """Publish a record's external operations; False (error recorded, lease ended) on failure."""
        if not record.external:
            return True
        try:
            # One transaction per other database for this record's messages; each commits
            # before the record is marked dispatched (at-least-once for other databases).
            with ExitStack() as stack:
                for alias in sorted({op["using"] for op in record.external if op["kind"] == QUEUE}):
                    require_alias(alias)
                    stack.enter_context(transaction.atomic(using=alias))
                for op in record.external:
                    if op["kind"] == QUEUE:
                        self._send(op, op["using"], record.age_s)
                    else:
                        destination(op["kind"]).dispatch(op)
        except Exception as exc:
            self._fail(record.message_id, f"{type(exc).__name__}: {exc}", lease, report)
            return False
        return True

    # -- 3. mark --
    def _mark(self, records: list[_Record], lease: _Lease, report: DispatchReport) -> None:
        if not records:
            return
        # Its own transaction after a publish; inside the claim's when nothing left the
        # database (no savepoint: a failed mark fails the whole chunk, lease and all).
        with transaction.atomic(using=self.using, savepoint=False):
            marked = self._mark_with_operations(records, lease, report)
        done = [record.message_id for record in records if record.message_id in marked]
        report.dispatched.extend(done)
        # Settled already: marked, failed, or found lost by _fail (its lease ran out before
        # its failure could be written): the rest lost their lease before the mark.
        settled = marked | set(report.failed) | set(report.lost)
        lost = [record.message_id for record in records if record.message_id not in settled]
        if lost:
            report.lost.extend(lost)
            log.warning("outbox: lost the lease of %d record(s) to another dispatcher (this one's ran out "
                        "before it marked them): %s; their local operations are left to it (operations "
                        "already published elsewhere go out again with the same ids)", len(lost), ", ".join(lost))

    def _mark_with_operations(self, records: list[_Record], lease: _Lease, report: DispatchReport) -> set[str]:
        """Mark the records and insert their own-database operations: in one savepoint for
        all; only if an operation fails, one savepoint each, so one bad record does not
        hold the others back.  Nothing here has left the database, so trying again is
        free of side effects.  A failure of the mark itself propagates (the lease stays)."""
        if len(records) > 1:
            try:
                with transaction.atomic(using=self.using):
                    return self._take(records, lease)
            except _OperationFailed:
                log.info("outbox: a record of %d failed to dispatch; dispatching one by one", len(records))
        marked: set[str] = set()
        for record in records:
            try:
                with transaction.atomic(using=self.using):
                    marked |= self._take([record], lease)
            except _OperationFailed as exc:
                self._fail(record.message_id, str(exc), lease, report)
        return marked

    def _take(self, records: list[_Record], lease: _Lease) -> set[str]:
        """Mark first: the compare-and-set row-locks the records still ours, so their
        operations are inserted only for them, in the mark's transaction."""
        marked = self.store.mark_dispatched([record.message_id for record in records], lease.token)
        ours = [record for record in records if record.message_id in marked]
        try:
            self._insert_records(ours)
        except Exception as exc:
            raise _OperationFailed(exc) from exc
        return marked

    def _insert_records(self, records: list[_Record]) -> None:
        """The records' own-database operations: every immediate message of them all in one
        enqueue (a statement per queue, in record order), then the delayed ones."""
        immediate = [_outgoing(op, self.using) for record in records for op in record.local if not is_delayed(op)]
        if immediate:
            Transport(self.using).enqueue(immediate)
        for record in records:
            for op in record.local:
                if is_delayed(op):
                    self._send(op, self.using, record.age_s)

    def _send(self, op: dict[str, Any], alias: str, age_s: float) -> None:
        """One queue operation: into its queue, or into the delayed store when it is delayed.

        A delay counts from the record's CreatedAt by the database's clock: what is left
        of it now (``age_s`` is the record's age by that clock) goes to the store, which
        adds it to its own now."""
        message = _outgoing(op, alias)
        transport = Transport(alias)
        left = max(float(op["delay"]) - age_s, 0.0) if op.get("delay") else 0.0
        if left > 0:
            transport.schedule(message, left, None)
        elif op.get("deliver_at"):  # an instant the caller gave (or a record stored before "delay")
            transport.schedule(message, None, dt.datetime.fromisoformat(op["deliver_at"]))
        else:
            transport.enqueue([message])

    # -- failures --
    def _fail(self, message_id: str, error: str, lease: _Lease, report: DispatchReport,
              quarantine: bool = False) -> None:
        """Keep the record undispatched with its LastError, and end its lease — unless
        the lease is no longer ours: then the record is another dispatcher's to judge."""
        if not self.store.fail(message_id, error, lease.token, quarantine=quarantine):
            report.lost.append(message_id)
            log.warning("outbox record %s failed to dispatch (%s) after another dispatcher took over "
                        "its lease; left to that dispatcher", message_id, error)
            return
        if quarantine:
            report.quarantined.append(message_id)
        else:
            report.failed[message_id] = error
            log.warning("outbox record %s not dispatched (will retry): %s", message_id, error)


def _outgoing(op: dict[str, Any], alias: str) -> OutgoingMessage:
    """The row a ``queue`` operation describes, exactly as built at send time (same message
    id and headers); UnknownQueue when the queue was deleted since."""
    return Transport(alias).outgoing(op["queue"], op["message_id"], op["headers"],
                                     base64.b64decode(op["body"], validate=True), ttl=op.get("ttl"))
