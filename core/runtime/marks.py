"""Where a receive starts its scan of a queue table: a low-water mark of RowVersion per
queue and database, kept in this process (a hint: the rows are the truth).

Why: a receive deletes the oldest rows, and on PostgreSQL their index entries stay until
no transaction could still see them.  While one session holds the MVCC horizon (idle in
a transaction, a long report) none can be dropped, so a receive that scans the
RowVersion index from its start walks every row delivered since the horizon was taken
before it finds a live one: the receive slows by the second, and the backlog grows.  A
receive that starts at the mark walks only the last few batches' entries.

Rows below the mark can become visible again: a receive that rolled back (here after the
mark moved on, or in another process), an insert that committed after later rows were
received.  So the mark stays :data:`TRAIL` RowVersions behind the first row a receive
took (the usual case of both), and one receive scans from the start again once the last
such full scan is :data:`FULL_SCAN_EVERY` seconds old, or twenty times the time that scan
took when it was slow (a held horizon makes it slow: this keeps its share of the
receive's time near 5 %), but never more than :data:`FULL_SCAN_MAX`.  A row stranded
below the mark waits for that scan: the FIFO order holds for the rows above the mark.

Only where the dialect says its scans pay for dead rows (``supports_receive_mark``).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

#: RowVersions the mark stays behind the first row a receive took.
TRAIL = 1000
#: Seconds between scans from the start of the table (at the least).
FULL_SCAN_EVERY = 1.0
#: A full scan that took d seconds comes again after at least this many times d ...
FULL_SCAN_SHARE = 20
#: ... and after this many seconds at the most (a stranded row's longest wait).
FULL_SCAN_MAX = 10.0

#: (database alias, queue, its registry row's id: a queue made anew starts without a mark)
Key = tuple[str, str, int | None]
#: Marks kept at most: past it (queues made and deleted by the thousand), they start again.
MAX_MARKS = 10_000


class Look(NamedTuple):
    """Where one receive starts (``start``; None: the start of the table) and when."""

    start: int | None
    began: float


@dataclass(slots=True)
class Mark:
    row_version: int  # where receives start
    due: float  # when the next full scan is due
    scanned: float  # when the full scan that set it began


class ReceiveMarks:
    """The marks of this process's receives, shared by their threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._marks: dict[Key, Mark] = {}

    def look(self, key: Key) -> Look:
        """Where a receive starts, taken just before its statement.  When a full scan is
        due, one thread gets it: the due time moves on at once, so the others go on from
        the mark (and if that scan fails, another comes a period later)."""
        now = self._clock()
        with self._lock:
            mark = self._marks.get(key)
            if mark is None:
                return Look(None, now)
            if now >= mark.due:
                mark.due = now + FULL_SCAN_EVERY
                return Look(None, now)
            return Look(mark.row_version, now)

    def received(self, key: Key, look: Look, first: int | None) -> None:
        """After the receive of ``look`` took ``first`` as its lowest RowVersion (None: no
        row), right after its statement (what it took is timed, not what is done with it)."""
        now = self._clock()
        with self._lock:
            mark = self._marks.get(key)
            if look.start is None:
                if mark is not None and look.began < mark.scanned:
                    return  # a full scan that began later has set the mark already
                again = look.began + min(FULL_SCAN_MAX, max(FULL_SCAN_EVERY, FULL_SCAN_SHARE * (now - look.began)))
                if first is not None:
                    if len(self._marks) >= MAX_MARKS and key not in self._marks:
                        self._marks.clear()
                    # (It may move back: rows came back below it.)
                    self._marks[key] = Mark(first - TRAIL, again, look.began)
                elif mark is not None:
                    # An empty queue keeps its mark: a queue that a worker keeps up with is
                    # empty often, and scanning from the start each time is what the mark saves.
                    mark.due, mark.scanned = again, look.began
            elif first is not None and mark is not None and mark.row_version >= look.start:
                # (Below look.start: a full scan lowered the mark meanwhile; it stays there.)
                mark.row_version = max(mark.row_version, first - TRAIL)

    def forget(self) -> None:
        """Every next receive scans from the start."""
        with self._lock:
            self._marks.clear()


#: This process's marks (core.transport's receives).
receive_marks = ReceiveMarks()
