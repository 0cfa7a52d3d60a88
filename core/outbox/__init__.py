"""The outbox (SPEC C4): exactly-once processing when outgoing messages leave this database.

Phase 1 runs inside the pump's receive transaction (or the caller's, for a session):

1. de-duplicate: a record for the incoming MessageId means the message was processed
   already — skip the handler and go to phase 2;
2. run the handler; its outgoing messages are collected, not sent (:class:`OutboxSender`);
3. store them in the outbox record, in the same transaction as the business writes;
4. commit.  On a SQL transport the *acknowledge* (the receive's DELETE of the incoming
   row) commits here too, with the business writes and the outbox record.

Phase 2, after the commit (:mod:`core.outbox.dispatch`): claim the records with a short
lease (a transaction of its own), publish what leaves this database with no transaction
open, then insert what stays in it and mark the records dispatched, together.  A crash
between publishing and marking publishes again after the lease, with the same message
and task ids — for the receivers' outboxes (queues) or task ids (Celery) to absorb.

Why the acknowledge is in phase 1 and not after phase 2, as the reference orders it: the
reference acknowledges last so that a crash after the commit redelivers the incoming
message, whose phase-1 lookup then finds the record and finishes phase 2.  Here the
incoming row is deleted by the same database transaction that stores the record, so it
cannot be acknowledged without its record existing, and :class:`OutboxDispatcher`
finishes any record a crash left undispatched (as it does for transactional sessions,
which have no incoming message to redeliver).  A duplicate that arrives while a record is
still undispatched finishes phase 2 itself, exactly as the reference describes.

Concurrency control (SLUICE_OUTBOX_CONCURRENCY_CONTROL):

- ``optimistic`` (default): the record is inserted after the handler; when two copies of
  a message are processed at once, the second insert hits the primary key, its handler's
  work rolls back and the copy counts as a duplicate.
- ``pessimistic``: the record is inserted *before* the handler; the second copy's insert
  waits on that row's lock until the first commits, then finds the key taken — its
  handler never runs.  Costs an UPDATE per message; worth it for expensive handlers or
  ones with side effects outside the database.

The package, by what each module holds:

- ``operations``: the stored JSON format of outgoing operations;
- ``destinations``: registered destination kinds (Celery) and ``queue@alias`` addresses;
- ``sender``: :class:`OutboxSender`, which collects a handler's or session's sends;
- ``store``: the table — its name, creation, every statement (:class:`OutboxStore`);
- ``phases``: :class:`Outbox` — phase 1, phase 2's entry points, the clean-up;
- ``dispatch``: phase 2 — claim with a lease, publish, mark;
- ``session``: :class:`OutboxSession` for code outside a handler;
- ``loops``: the background dispatcher and clean-up loops;
- ``retention``: retention versus the retry window.
"""
from core.outbox.destinations import Destination, UnknownDestination, destination, parse_address, register_destination
from core.outbox.dispatch import DISPATCH_CHUNK, DISPATCH_LEASE_SECONDS, DispatchReport
from core.outbox.loops import MAX_CLEANUP_BATCHES_PER_STEP, OutboxCleanup, OutboxDispatcher, worker_loops
from core.outbox.operations import (
    EMPTY_OPERATIONS,
    FORMAT_VERSION,
    QUEUE,
    UnreadableOperations,
    decode_operations,
    describe,
    encode_operations,
    queue_operation,
    serialize_operation,
)
from core.outbox.phases import Outbox, Phase1Result
from core.outbox.retention import longest_retry_window, retention_warnings
from core.outbox.sender import OutboxSender
from core.outbox.session import DuplicateMessage, OutboxSession, collector_for
from core.outbox.store import PERSISTENCE_VERSION, OutboxConflict, OutboxStats, OutboxStore, create_outbox_table, outbox_table

__all__ = [
    "Outbox", "OutboxSession", "OutboxDispatcher", "OutboxCleanup", "OutboxSender", "OutboxStore", "OutboxStats",
    "OutboxConflict", "DuplicateMessage", "UnknownDestination", "UnreadableOperations", "Destination",
    "DispatchReport", "Phase1Result", "register_destination", "destination", "parse_address", "collector_for",
    "create_outbox_table", "outbox_table", "retention_warnings", "longest_retry_window", "worker_loops",
    "decode_operations", "encode_operations", "serialize_operation", "queue_operation", "describe",
    "EMPTY_OPERATIONS", "QUEUE", "FORMAT_VERSION", "PERSISTENCE_VERSION",
    "DISPATCH_CHUNK", "DISPATCH_LEASE_SECONDS", "MAX_CLEANUP_BATCHES_PER_STEP",
]
