"""Where a receive starts its scan of a queue table: a low-water mark of RowVersion per
queue and database, kept in this process (a hint: the rows are the truth).

Why: a receive deletes the oldest rows, and on PostgreSQL their index entries stay until
no transaction could still see them.  While one session holds the MVCC horizon (idle in
a transaction, a long report) none can be dropped, so a receive that scans the
RowVersion index from its start walks every row delivered since the horizon was taken
before it finds a live one: the receive slows by the second, and the backlog grows.  A
receive that starts at the mark walks only the last few batches' entries.

Rows below the mark can become visible again: a receive that rolled back, an insert that
committed after later rows were received.  So the mark stays :data:`TRAIL` RowVersions
behind the first row a receive took (the usual case of both), and a receive scans from
the start again once the last such full scan is :data:`FULL_SCAN_EVERY` seconds old, or
twenty times the time that scan took when it was slow (a held horizon makes it slow, and
this keeps its share of the receive's time under 5 %).  A row stranded below the mark
therefore waits at most that long, as a row on an idle queue waits for a peek.

Only where the dialect says its scans pay for dead rows (``supports_receive_mark``).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

#: RowVersions the mark stays behind the first row a receive took.
TRAIL = 1000
#: Seconds between scans from the start of the table (at the least).
FULL_SCAN_EVERY = 1.0
#: A full scan that took d seconds comes again after at least this many times d.
FULL_SCAN_SHARE = 20

#: (database alias, queue, its registry row's id: a queue made anew starts without a mark)
Key = tuple[str, str, int | None]
#: Marks kept at most: past it (queues made and deleted by the thousand), they start again.
MAX_MARKS = 10_000


class ReceiveMarks:
    """The marks of this process's receives, shared by their threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # key → (mark, when the next full scan is due)
        self._marks: dict[Key, tuple[int, float]] = {}

    def start(self, key: Key) -> int | None:
        """The RowVersion a receive starts from; None: from the start of the table."""
        with self._lock:
            entry = self._marks.get(key)
        if entry is None or self._clock() >= entry[1]:
            return None
        return entry[0]

    def received(self, key: Key, start: int | None, first: int | None, seconds: float) -> None:
        """After a receive that started at ``start`` (None: a full scan), took ``seconds``
        and took ``first`` as its lowest RowVersion (None: no row)."""
        with self._lock:
            entry = self._marks.get(key)
            if start is None:
                again = self._clock() + max(FULL_SCAN_EVERY, FULL_SCAN_SHARE * seconds)
                if first is not None:
                    if len(self._marks) >= MAX_MARKS and key not in self._marks:
                        self._marks.clear()
                    self._marks[key] = (first - TRAIL, again)  # (it may move back: rows came back)
                elif entry is not None:
                    # An empty queue keeps its mark: a queue that a worker keeps up with is
                    # empty often, and scanning from the start each time is what the mark saves.
                    self._marks[key] = (entry[0], again)
            elif first is not None and entry is not None:
                self._marks[key] = (max(entry[0], first - TRAIL), entry[1])

    def forget(self) -> None:
        """Every next receive scans from the start."""
        with self._lock:
            self._marks.clear()


#: This process's marks (core.transport's receives).
receive_marks = ReceiveMarks()
