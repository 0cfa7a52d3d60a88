"""Limits per queue across the worker pool: at most N messages of a queue handled at once,
and at most R taken per second, whatever the number of workers.

Where a queue's limits come from, first found wins:

1. the operator's, kept in ``sluice_queue_limit`` (set from the dashboard's queue page, the
   API or ``sluice queue limit``; audited).  A row with neither limit lifts the setting's;
   ``--clear`` deletes the row and the setting applies again;
2. ``SLUICE_QUEUE_LIMITS = {"queue": {"concurrency": N, "rate": R}}`` (every worker should
   have the same: a worker enforces the limits it knows).

They are enforced through the database, not through a process's memory nor Redis: a
receive of a limited queue locks one of the queue's N slot rows and one ticket row per
message it takes, in the receive's own transaction (core.receive.permits).  A worker
killed mid-handler loses its connection; the database ends its transaction and with it
the locks, and its messages go back to the queue: nothing is lost, nothing is run twice
in the database, and the slot is free again.

Every process keeps the limits in force in memory (:class:`LimitBoard`, one per database
alias), read again exactly as the paused queues are (core/runtime/pauses.py: the same
notification and the same poll), so an unlimited queue's receive costs a dict look-up and
no statement.  A change applies from each pump's next receive.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.dispatch import Signal

from core.conf import get_settings
from core.conf.values import limit_value, queue_limits
from core.models import QueueLimit, QueueSlot, QueueTicket
from core.queues import registry
from core.runtime.boards import Boards, TableBoard
from core.runtime.pauses import announce

#: Sent after an operator's limits committed that changed something: ``queue``,
#: ``concurrency`` and ``rate`` (None: none), ``cleared`` (the override was deleted),
#: ``by`` and ``via`` ("cli", "web", "api", "" for code).  The dashboard audits the command
#: line's from here (the engine does not import it).
limits_changed = Signal()

#: A ticket never used: free at once.
NEVER = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Limits:
    """A queue's limits in force: ``concurrency`` messages at once and ``rate`` per second
    across the pool (None: no such limit), and where they come from."""

    queue: str
    concurrency: int | None
    rate: int | None
    #: "database" (an operator's, :data:`set_at` and :data:`set_by` say when and who),
    #: "settings" (SLUICE_QUEUE_LIMITS) or "" (none).
    source: str = ""
    set_at: dt.datetime | None = None
    set_by: str = ""

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    def as_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "concurrency": self.concurrency, "rate": self.rate, "source": self.source,
                "set_at": self.set_at.isoformat() if self.set_at else None, "set_by": self.set_by or None}


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE


def _from_settings() -> dict[str, tuple[int | None, int | None]]:
    return queue_limits(get_settings().QUEUE_LIMITS)


def _row_limits(row: QueueLimit) -> Limits:
    return Limits(row.queue, row.concurrency, row.rate, "database", row.set_at, row.set_by)


def limits_in_force(using: str | None = None) -> dict[str, Limits]:
    """Every limited queue's limits, by name (module doc: an operator's win)."""
    found = {queue: Limits(queue, c, r, "settings") for queue, (c, r) in _from_settings().items()}
    for row in QueueLimit.objects.using(_alias(using)):
        found[row.queue] = _row_limits(row)
    return {queue: limits for queue, limits in sorted(found.items()) if limits.limited}


def limits_of(queue: str, using: str | None = None) -> Limits:
    """``queue``'s limits in force (``limited`` False: none)."""
    row = QueueLimit.objects.using(_alias(using)).filter(queue=queue).first()
    if row is not None:
        return _row_limits(row)
    c, r = _from_settings().get(queue, (None, None))
    return Limits(queue, c, r, "settings" if c is not None or r is not None else "")


def set_limits(queue: str, *, concurrency: int | None, rate: int | None, by: str = "", via: str = "",
               using: str | None = None) -> tuple[Limits, bool]:
    """Set an operator's limits on ``queue`` (UnknownQueue when it does not exist; ValueError
    for a limit that is not a whole number 1–10,000).  Both None: no limit, whatever the
    settings say.  Returns the limits in force and whether this call changed them."""
    concurrency = limit_value("concurrency", concurrency, f"queue {queue}")
    rate = limit_value("rate", rate, f"queue {queue}")
    alias = _alias(using)
    name = registry.get(queue, alias).name
    with transaction.atomic(using=alias):
        row = QueueLimit.objects.using(alias).select_for_update().filter(queue=name).first()
        changed = row is None or (row.concurrency, row.rate) != (concurrency, rate)
        if changed:
            QueueLimit.objects.using(alias).update_or_create(
                queue=name, defaults={"concurrency": concurrency, "rate": rate, "set_at": Now(),
                                      "set_by": by[:150]})
            _ensure_rows(name, concurrency, rate, alias)
            announce(name, alias)
    if changed:
        limits_changed.send(sender=Limits, queue=name, concurrency=concurrency, rate=rate, cleared=False,
                            by=by, via=via)
    return limits_of(name, alias), changed


def clear_limits(queue: str, *, by: str = "", via: str = "", using: str | None = None) -> bool:
    """Delete the operator's limits on ``queue``: SLUICE_QUEUE_LIMITS applies again.  False:
    there were none."""
    alias = _alias(using)
    name = registry.get(queue, alias).name
    with transaction.atomic(using=alias):
        deleted, _ = QueueLimit.objects.using(alias).filter(queue=name).delete()
        if deleted:
            announce(name, alias)
    if deleted:
        limits_changed.send(sender=Limits, queue=name, concurrency=None, rate=None, cleared=True, by=by, via=via)
    return bool(deleted)


def _ensure_rows(queue: str, concurrency: int | None, rate: int | None, alias: str) -> None:
    """The queue's slot rows 1..concurrency and ticket rows 1..rate exist (receives only
    look at rows up to the limit, so rows above a lowered one are left, harmless)."""
    for model, field, wanted, extra in ((QueueSlot, "slot", concurrency, {}),
                                        (QueueTicket, "ticket", rate, {"used_at": NEVER})):
        if not wanted:
            continue
        rows = model.objects.using(alias).filter(queue=queue, **{f"{field}__lte": wanted})
        have = set(rows.values_list(field, flat=True))
        missing = [model(queue=queue, **{field: n}, **extra) for n in range(1, wanted + 1) if n not in have]
        if not missing:
            continue
        try:
            with transaction.atomic(using=alias):
                model.objects.using(alias).bulk_create(missing, batch_size=500)
        except IntegrityError:
            pass  # another process made them meanwhile: they exist, which is all this wants


class LimitBoard(TableBoard[dict[str, Limits]]):
    """This process's view of the limited queues of one database (module doc): read again
    as core.runtime.pauses.PauseBoard is (core.runtime.boards), and when the settings
    object changes."""

    def __init__(self, using: str) -> None:
        self._settings: Any = None
        super().__init__(using, {})

    def _stale(self) -> bool:
        return self._settings is not get_settings()

    def limits(self, queue: str, polling: bool) -> Limits | None:
        """``queue``'s limits, None when it has none; reads the tables only when told of a
        change, when the settings changed or, with ``polling``, past the poll interval."""
        return self.current(polling).get(queue)

    def _read(self) -> dict[str, Limits]:
        settings = get_settings()
        found = limits_in_force(self.using)
        for limits in found.values():
            _ensure_rows(limits.queue, limits.concurrency, limits.rate, self.using)
        self._settings = settings
        return found


_boards: Boards[LimitBoard] = Boards(LimitBoard)


def board(using: str) -> LimitBoard:
    """The process's limit board for ``using`` (made on first use, kept for the process's life)."""
    return _boards.get(using)


def forget() -> None:
    """Every board reads the tables again at its next look (a database changed behind
    Sluice's back: a restored backup, a test database flushed)."""
    _boards.forget()
