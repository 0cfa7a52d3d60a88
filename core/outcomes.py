"""What became of a received message: an outcome as a type, not a string.

A low module (it imports nothing from core), so the pump, its transaction modes and
anything that counts or records outcomes share it without an import cycle.  Where a
*failed* message went is :class:`core.recoverability.FailureOutcome`.  The members are
``StrEnum`` values: they log, compare and serialise as their text.
"""
from __future__ import annotations

from enum import StrEnum


class MessageOutcome(StrEnum):
    """What one received message came to in the pump (one per message, counted in PumpStats)."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    ERRORED = "errored"
    EXPIRED = "expired"
    POISON = "poison"
    #: A copy of a message the outbox had processed already: its handler was skipped.
    DUPLICATE = "duplicates"
