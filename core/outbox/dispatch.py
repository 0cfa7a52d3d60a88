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
3. **Mark** (one transaction): insert the record's operations on this database — its
   queues and delayed store — and mark it dispatched, together.  They happen exactly once.

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
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from core.outbox.destinations import destination, require_alias
from core.outbox.operations import QUEUE, UnreadableOperations, decode_operations, is_delayed
from core.outbox.store import OutboxStore
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


@dataclass
class _Record:
    message_id: str
    age_s: float
    #: Operations that land in the outbox's own database (inserted with the mark).
    local: list[dict[str, Any]]
    #: Everything else: published before the mark, outside any transaction here.
    external: list[dict[str, Any]]


class Phase2:
    """Claim, publish, mark for the outbox table of ``store``."""

    def __init__(self, store: OutboxStore, lease_seconds: float = DISPATCH_LEASE_SECONDS) -> None:
        self.store = store
        self.using = store.using
        self.lease_seconds = lease_seconds

    def run(self, message_ids: list[str], include_quarantined: bool, report: DispatchReport) -> None:
        for start in range(0, len(message_ids), DISPATCH_CHUNK):
            chunk = message_ids[start:start + DISPATCH_CHUNK]
            with transaction.atomic(using=self.using):
                records = self._claim(chunk, include_quarantined, report)
                if not any(record.external for record in records):
                    # Nothing leaves the database: claim, insert and mark in one transaction.
                    self._mark(records, report)
                    continue
            # The lease is committed: publish with no transaction open here, then mark.
            ready = [record for record in records if self._publish(record, report)]
            self._mark(ready, report)

    # -- 1. claim --
    def _claim(self, ids: list[str], include_quarantined: bool, report: DispatchReport) -> list[_Record]:
        claimed = self.store.claim(ids, self.lease_seconds, include_quarantined)
        records = []
        for row in claimed:
            try:
                operations = decode_operations(row.operations)
            except UnreadableOperations as exc:
                self._fail(row.message_id, f"quarantined: {exc}", report, quarantine=True)
                log.error("outbox record %s quarantined: %s", row.message_id, exc)
                continue
            local = [op for op in operations if self._is_local(op)]
            records.append(_Record(row.message_id, row.age_s, local,
                                   [op for op in operations if not self._is_local(op)]))
        return records

    def _is_local(self, op: dict[str, Any]) -> bool:
        return op["kind"] == QUEUE and op.get("using") in (None, self.using)

    # -- 2. publish --
    def _publish(self, record: _Record, report: DispatchReport) -> bool:
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
            self._fail(record.message_id, f"{type(exc).__name__}: {exc}", report)
            return False
        return True

    # -- 3. mark --
    def _mark(self, records: list[_Record], report: DispatchReport) -> None:
        if not records:
            return
        with transaction.atomic(using=self.using):
            done = self._insert_local(records, report)
            if done:
                self.store.mark_dispatched(done)
        report.dispatched.extend(done)

    def _insert_local(self, records: list[_Record], report: DispatchReport) -> list[str]:
        """Insert the records' own-database operations: in one savepoint for all; only if
        that fails, one savepoint each, so one bad record does not hold the others back.
        Nothing here has left the database, so trying again is free of side effects."""
        if len(records) > 1:
            try:
                with transaction.atomic(using=self.using):
                    for record in records:
                        self._insert_record(record)
                return [record.message_id for record in records]
            except Exception:
                log.info("outbox: a record of %d failed to dispatch; dispatching one by one", len(records))
        done = []
        for record in records:
            try:
                with transaction.atomic(using=self.using):
                    self._insert_record(record)
                done.append(record.message_id)
            except Exception as exc:
                self._fail(record.message_id, f"{type(exc).__name__}: {exc}", report)
        return done

    def _insert_record(self, record: _Record) -> None:
        immediate = [op for op in record.local if not is_delayed(op)]
        if immediate:
            Transport(self.using).enqueue([_outgoing(op, self.using) for op in immediate])
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
    def _fail(self, message_id: str, error: str, report: DispatchReport, quarantine: bool = False) -> None:
        """Keep the record undispatched with its LastError, and end its lease."""
        with transaction.atomic(using=self.using):
            self.store.set_error(message_id, error, quarantine=quarantine)
            self.store.release([message_id])
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
