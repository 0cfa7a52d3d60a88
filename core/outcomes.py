"""What became of a received message: an outcome as a type, not a string, and their counts.

A low module (it imports nothing from core), so the pump, its transaction modes and
anything that counts or records outcomes share it without an import cycle.  Where a
*failed* message went is :class:`core.receive.recoverability.FailureOutcome`.  The members are
``StrEnum`` values: they log, compare and serialise as their text.
"""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class PumpStats:
    """How many received messages came to each outcome (a pump's, a step's, a batch's)."""

    received: int = 0
    succeeded: int = 0
    retried: int = 0
    errored: int = 0
    expired: int = 0
    poison: int = 0
    #: Copies of already processed messages absorbed by the outbox (handler skipped).
    duplicates: int = 0

    def add(self, other: "PumpStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def count(self, outcome: MessageOutcome) -> None:
        setattr(self, outcome.value, getattr(self, outcome.value) + 1)
