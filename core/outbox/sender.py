"""Collecting a handler's or session's outgoing messages instead of sending them."""
from __future__ import annotations

from typing import Any

from django.db import connections

from core.outbox.destinations import destination, parse_address
from core.outbox.operations import encode_operations, queue_operation, serialize_operation
from core.savepoints import SavepointHeld, innermost_savepoint
from core.scheduling import resolve_due
from core.tracing import producing as tracing
from core.transport import Transport


class OutboxSender:
    """Collects outgoing operations instead of sending them.

    It stands in for the :class:`~core.transport.Transport` of a handler's context (same
    ``send`` signature, same ``using``) and is what a transactional session sends with.
    Every operation is validated and serialized when it is added, so bad input raises in
    the caller's transaction and rolls its business writes back with it.  Operations
    added inside an atomic block that rolled back are dropped, as its writes were
    (core.savepoints): read :attr:`operations` and :meth:`encode` before the commit.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        #: (operation, its serialized form)
        self._held: SavepointHeld[tuple[dict[str, Any], str]] = SavepointHeld(using)

    def anchor(self) -> None:
        """Called in the atomic block whose end stores the operations: what is added
        directly in it needs no savepoint mark (if it rolls back, nothing is stored)."""
        self._held.base = innermost_savepoint(connections[self.using].savepoint_ids)

    @property
    def operations(self) -> list[dict[str, Any]]:
        """The operations that count: none from a rolled-back atomic block."""
        return [op for op, _ in self._held.survivors()]

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Like :meth:`Transport.send`, plus ``queue@alias`` (another configured database)
        and ``delay`` (seconds) / ``deliver_at`` (aware datetime) for delayed delivery.
        A delay is stored as it is and counted from the record's CreatedAt by the
        database's clock, so neither this process's clock nor a late dispatch moves it.
        Returns the message id."""
        name, alias = parse_address(queue)
        delay, deliver_at = resolve_due(options.pop("delay", None), options.pop("deliver_at", None))
        # The send span: its context, captured in the operation's headers now, is what the
        # dispatch links to and the receiver's process span hangs from.
        with tracing.send_span(name, delayed=delay is not None or deliver_at is not None) as span:
            message = Transport(alias or self.using).build(name, body, **options)  # unknown queue, bad headers, …
            self._append(queue_operation(message, alias if alias != self.using else None, delay, deliver_at))
            if span is not None:
                tracing.sent(span, [message])
        return message.message_id

    def add(self, kind: str, op: dict[str, Any]) -> None:
        """Add an operation for a registered destination kind (e.g. ``celery``)."""
        found = destination(kind)
        op = {**op, "kind": kind}
        if found.validate is not None:
            found.validate(op)
        self._append(op)

    def _append(self, op: dict[str, Any]) -> None:
        self._held.add([(op, serialize_operation(op))])

    def encode(self) -> str:
        return encode_operations([text for _, text in self._held.survivors()])
