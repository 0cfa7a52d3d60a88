"""Paused queues: an operator stops a queue's consumption, and later resumes it.

The state is a row per paused queue in ``sluice_queue_pause`` (who, and when in the
database clock): a restart keeps it.  Only receiving stops.  Sends still land, the
delayed mover still moves due messages into the queue, expiry purges still run.

Every process keeps the paused queues in memory (:class:`PauseBoard`, one per database
alias): a pump asks it before each receive, a set lookup and no statement.  The board reads
the table again only when told to:

- a pause or resume in this process: when its transaction commits, through the wake-up hub
  (:data:`PAUSES_KEY`, then the queue's own key so its idle pumps step at once);
- in another process on PostgreSQL: the ``NOTIFY`` on :data:`~core.runtime.wakeups.PAUSE_CHANNEL`
  sent inside the pause's transaction, heard by the process's one ``LISTEN`` connection
  (core.runtime.wakeups), which does the same;
- where the database has no notifications (SQLite, SQL Server), or while the ``LISTEN``
  connection is lost, at most every ``wake_poll_interval`` seconds (the dialect's), as the
  pumps poll for messages then too.

A pump in the middle of a batch finishes it; the next receive is the one that stops.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models.functions import Now
from django.dispatch import Signal

from core.conf import get_settings
from core.dialects import dialect_for
from core.models import QueuePause
from core.queues import registry
from core.runtime.boards import Boards, TableBoard
from core.runtime.wakeups import PAUSE_CHANNEL, PAUSES_KEY, on_commit_wake, queue_key, wake_hub

#: Sent after a pause or resume committed that changed something: ``queue``, ``paused``
#: (True / False), ``by`` and ``via`` ("cli", "web", "api", "" for code).  The dashboard
#: audits the command line's from here (the engine does not import it).
pause_changed = Signal()


@dataclass(frozen=True)
class PauseInfo:
    """A paused queue: since when (the database's clock) and by whom."""

    queue: str
    paused_at: dt.datetime
    paused_by: str

    def as_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "paused": True, "paused_at": self.paused_at.isoformat(),
                "paused_by": self.paused_by}


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE


def _info(row: QueuePause) -> PauseInfo:
    return PauseInfo(row.queue, row.paused_at, row.paused_by)


def paused_queues(using: str | None = None) -> dict[str, PauseInfo]:
    """Every paused queue, by name."""
    return {row.queue: _info(row) for row in QueuePause.objects.using(_alias(using)).order_by("queue")}


def pause_of(queue: str, using: str | None = None) -> PauseInfo | None:
    row = QueuePause.objects.using(_alias(using)).filter(queue=queue).first()
    return None if row is None else _info(row)


def pause(queue: str, *, by: str = "", via: str = "", using: str | None = None) -> tuple[PauseInfo, bool]:
    """Pause ``queue`` (which must exist: UnknownQueue otherwise).  Returns its pause and
    whether this call paused it (False: it already was; the first pause is kept)."""
    alias = _alias(using)
    name = registry.get(queue, alias).name
    with transaction.atomic(using=alias):
        row, created = QueuePause.objects.using(alias).get_or_create(
            queue=name, defaults={"paused_at": Now(), "paused_by": by[:150]})
        if created:
            announce(name, alias)
    if created:
        row.refresh_from_db(using=alias, fields=["paused_at"])  # the time as the database wrote it
        pause_changed.send(sender=PauseInfo, queue=name, paused=True, by=by, via=via)
    return _info(row), created


def resume(queue: str, *, by: str = "", via: str = "", using: str | None = None) -> bool:
    """Resume ``queue`` (UnknownQueue when it does not exist).  False: it was not paused."""
    alias = _alias(using)
    name = registry.get(queue, alias).name
    with transaction.atomic(using=alias):
        deleted, _ = QueuePause.objects.using(alias).filter(queue=name).delete()
        if deleted:
            announce(name, alias)
    if deleted:
        pause_changed.send(sender=PauseInfo, queue=name, paused=False, by=by, via=via)
    return bool(deleted)


def announce(name: str, alias: str) -> None:
    """Tell every process once this transaction commits (module doc): a pause, a resume, or
    a change of the queue's limits (core/runtime/limits.py), whose boards listen too."""
    d = dialect_for(connections[alias], get_settings().SCHEMA)
    notify_sql = d.notify() if d.supports_notify else None
    if notify_sql is not None:
        # Inside the transaction: PostgreSQL delivers it at commit (pauses are rare, so the
        # commit's notify lock costs nothing that matters).
        with connections[alias].cursor() as cursor:
            cursor.execute(notify_sql, [PAUSE_CHANNEL, name])

    def wake() -> None:
        wake_hub.wake(PAUSES_KEY)
        wake_hub.wake(queue_key(name))

    on_commit_wake(wake, alias, f"pause of {name}")


class PauseBoard(TableBoard[frozenset[str]]):
    """This process's view of the paused queues of one database (core.runtime.boards)."""

    def __init__(self, using: str) -> None:
        super().__init__(using, frozenset())

    def is_paused(self, queue: str, polling: bool) -> bool:
        """Whether ``queue`` is paused; reads the table only when told of a change or, with
        ``polling`` (no notifications reach this process), when the last read is older
        than the dialect's poll interval."""
        return queue in self.current(polling)

    def _read(self) -> frozenset[str]:
        return frozenset(QueuePause.objects.using(self.using).values_list("queue", flat=True))


_boards: Boards[PauseBoard] = Boards(PauseBoard)


def board(using: str) -> PauseBoard:
    """The process's board for ``using`` (made on first use, kept for the process's life)."""
    return _boards.get(using)


def forget() -> None:
    """Every board of this process reads the table again at its next look: for a change
    made behind Sluice's back (a restored backup, a test database flushed)."""
    _boards.forget()
