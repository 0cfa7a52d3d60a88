"""The transactional session: outbox messages from code outside a handler."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from core.errors import ConfigurationError, SluiceError
from core.outbox.operations import EMPTY_OPERATIONS
from core.outbox.phases import Outbox
from core.outbox.sender import OutboxSender
from core.outbox.store import OutboxConflict
from core.outgoing import new_id
from core.transport import validate_message_id


class DuplicateMessage(SluiceError):
    """A transactional session's message id was processed already (its messages were sent)."""


class OutboxSession:
    """Messages from code outside a handler (a view, a command, a Celery task) that commit
    with its business writes and are dispatched after the commit::

        with transaction.atomic(), OutboxSession(message_id=f"order-{order.pk}-placed") as session:
            if session.already_processed:   # a retried request: it all happened already
                return
            order.save()
            session.send("billing", {"order": order.pk}, message_type="BillOrder")

    The session is an atomic block itself (a savepoint inside an outer one).  On leaving
    it stores one outbox record holding the messages; dispatch runs on commit, and the
    background dispatcher finishes it if the process dies first.  A stable ``message_id``
    makes a retry safe: the second session with the same id sends nothing —
    ``already_processed`` says so up front, :meth:`send` raises DuplicateMessage, and a
    concurrent twin that got past the check fails at the end with DuplicateMessage, which
    rolls its business writes back too.
    """

    def __init__(self, message_id: str | None = None, *, using: str | None = None,
                 outbox: Outbox | None = None) -> None:
        if message_id is not None:
            validate_message_id(message_id)
        self.outbox = outbox or Outbox(using)
        self.using = self.outbox.using
        self.stable = message_id is not None
        self.message_id = message_id or new_id()
        self.already_processed = False
        self.sender = OutboxSender(self.using)
        self._placeholder = False
        self._atomic: Any = None

    def __enter__(self) -> "OutboxSession":
        self._atomic = transaction.atomic(using=self.using)
        self._atomic.__enter__()
        self.sender.anchor()
        try:
            if self.stable:
                self.already_processed = self.outbox.store.state(self.message_id) is not None
                if not self.already_processed and self.outbox.pessimistic:
                    try:
                        with transaction.atomic(using=self.using):
                            self.outbox.store.insert(self.message_id, EMPTY_OPERATIONS, dispatched=False)
                        self._placeholder = True
                    except OutboxConflict:
                        self.already_processed = True
        except BaseException as error:
            self._atomic.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def send(self, queue: str, body: Any, **options: Any) -> str:
        """Send through the outbox (``queue``, ``queue@alias``; ``delay``/``deliver_at``)."""
        self._check()
        return self.sender.send(queue, body, **options)

    def add(self, kind: str, op: dict[str, Any]) -> None:
        """An operation for a registered destination (see workers.outbox for Celery)."""
        self._check()
        self.sender.add(kind, op)

    def _check(self) -> None:
        if self._atomic is None:
            raise ConfigurationError("use OutboxSession as a context manager: `with OutboxSession() as session:`")
        if self.already_processed:
            raise DuplicateMessage(f"session {self.message_id} was processed already; its messages were sent then")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._store()
            except BaseException as error:
                self._atomic.__exit__(type(error), error, error.__traceback__)
                raise
        self._atomic.__exit__(exc_type, exc, tb)

    def _store(self) -> None:
        if self.already_processed:
            return
        has_operations = bool(self.sender.operations)
        if self._placeholder:
            self.outbox.store.store_operations(self.message_id, self.sender.encode(), dispatched=not has_operations)
        elif has_operations or self.stable:
            try:
                self.outbox.store.insert(self.message_id, self.sender.encode(), dispatched=not has_operations)
            except OutboxConflict:
                raise DuplicateMessage(
                    f"session {self.message_id} was processed concurrently; this one rolls back") from None
        if has_operations:
            message_id = self.message_id
            transaction.on_commit(lambda: self.outbox.after_commit([message_id]), using=self.using, robust=True)


def collector_for(target: Any) -> OutboxSession | OutboxSender:
    """What takes outbox operations for ``target``: a session, or a handler context in
    outbox mode (its transport is an OutboxSender)."""
    if isinstance(target, (OutboxSession, OutboxSender)):
        return target
    sender = getattr(target, "transport", None)
    if isinstance(sender, OutboxSender):
        return sender
    raise ConfigurationError(
        "this needs the outbox: pass an OutboxSession, or a handler context of a pump in "
        "SLUICE_TRANSACTION_MODE=outbox"
    )
