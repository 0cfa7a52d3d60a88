"""What became of a message: outcomes as types, not strings.

A low module (it imports nothing from core), so recoverability, the pump and anything
that counts outcomes can share it without an import cycle.  The members are ``StrEnum``
values: they log, compare and serialise as their text ("retry", …).
"""
from __future__ import annotations

from enum import StrEnum


class FailureOutcome(StrEnum):
    """Where a message whose handler failed went (``Recoverability.on_failure``)."""

    #: Back into its queue for another immediate attempt.
    RETRY = "retry"
    #: To the delayed store, for a delayed retry.
    DELAYED_RETRY = "delayed-retry"
    #: To the error queue: no retries left (or none allowed).
    ERROR = "error"

    @property
    def retried(self) -> bool:
        """True when the message will be attempted again."""
        return self is not FailureOutcome.ERROR


class MessageOutcome(StrEnum):
    """What one received message came to in the pump (one per message, counted in PumpStats)."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    ERRORED = "errored"
    EXPIRED = "expired"
    POISON = "poison"
    #: A copy of a message the outbox had processed already: its handler was skipped.
    DUPLICATE = "duplicates"
