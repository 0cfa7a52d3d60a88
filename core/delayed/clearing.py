"""When the mover takes forwarded messages out of their delayed store.

A store on the mover's own database shares the queue insert's transaction: forwarding
and removal commit together, exactly once (and the mover may claim — delete as it
reads).  Any other store (another database, a store of your own) is cleared only after
the queue insert committed: a crash between the two commits forwards a message twice,
never loses it — at least once.  A SQL store elsewhere gets a transaction of its own
around the mover's, so its fetch locks hold until the removal commits.
"""
from __future__ import annotations

import contextlib
from typing import Any

from django.db import transaction

from core.scheduling import DelayedMessage, DelayedMessageStore


class StoreClearing:
    """Removal of forwarded messages from ``store`` for a mover on database ``using``."""

    def __init__(self, store: DelayedMessageStore, using: str) -> None:
        self.store = store
        self.store_using: str | None = getattr(store, "using", None)
        #: Forward and removal commit together (the store's table is on ``using``).
        self.shares_transaction = self.store_using == using
        #: Forwarded messages waiting for the queue commit before they leave the store.
        self.pending: list[DelayedMessage] = []

    def store_transaction(self) -> Any:
        """The store's own transaction, entered around the mover's (none where it shares
        the mover's, or has no database): its commit comes after the queue insert's."""
        self.pending = []
        if self.shares_transaction or self.store_using is None:
            return contextlib.nullcontext()
        return transaction.atomic(using=self.store_using)

    def forwarded(self, messages: list[DelayedMessage]) -> None:
        """Messages whose queue insert is done (not yet committed): out of a store that
        shares the transaction at once; out of any other after :meth:`queue_committed`."""
        if self.shares_transaction:
            self.remove(messages)
        else:
            self.pending.extend(messages)

    def queue_committed(self) -> None:
        if self.pending:
            self.remove(self.pending)

    def remove(self, messages: list[DelayedMessage]) -> None:
        """Take forwarded messages out of the store: in one statement where it can."""
        remove_many = getattr(self.store, "remove_many", None)
        if remove_many is not None:
            remove_many(messages)
        else:
            for message in messages:
                self.store.remove(message)
