"""The outbox's loops (core.runtime.loops protocol): the background dispatcher and the clean-up."""
from __future__ import annotations

import logging

from core.conf import get_settings
from core.outbox.dispatch import DISPATCH_CHUNK
from core.outbox.phases import Outbox
from core.outbox.retention import retention_warnings
from core.outbox.store import OutboxStore

log = logging.getLogger("sluice.outbox")

#: Clean-up statements one OutboxCleanup step runs at most before yielding.
MAX_CLEANUP_BATCHES_PER_STEP = 25


class OutboxDispatcher:
    """A loop: dispatches records a crash left undispatched (older than the grace period)."""

    def __init__(self, using: str | None = None, *, interval: float | None = None, grace: float | None = None,
                 batch_size: int = DISPATCH_CHUNK, table: str | None = None) -> None:
        s = get_settings()
        self.outbox = Outbox(using, table)
        self.name = f"outbox-dispatcher:{self.outbox.using}"
        self.interval = s.OUTBOX_DISPATCHER_INTERVAL if interval is None else interval
        self.grace = s.OUTBOX_DISPATCHER_GRACE if grace is None else grace
        self.batch_size = batch_size
        self.dispatched = 0

    def step(self) -> float:
        ids = self.outbox.store.due(self.grace, self.batch_size)
        if not ids:
            return self.interval
        report = self.outbox.dispatch(ids)
        self.dispatched += len(report.dispatched)
        if report.dispatched:
            log.info("outbox dispatcher finished %d record(s) left undispatched", len(report.dispatched))
        full = len(ids) == self.batch_size and len(report.dispatched) == len(ids)
        return 0.0 if full else self.interval

    def pending(self) -> bool:
        """Records still waiting for a first dispatch (failed ones and the grace period aside)."""
        return bool(self.outbox.store.due(0, 1, include_failed=False))

    def close(self) -> None:
        pass


class OutboxCleanup:
    """A loop: deletes de-duplication data older than the retention every interval."""

    def __init__(self, using: str | None = None, *, interval: float | None = None,
                 keep_seconds: float | None = None, table: str | None = None) -> None:
        s = get_settings()
        self.outbox = Outbox(using, table)
        self.name = f"outbox-cleanup:{self.outbox.using}"
        self.interval = s.OUTBOX_CLEANUP_INTERVAL if interval is None else interval
        self.keep_seconds = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR if keep_seconds is None else keep_seconds
        self.deleted = 0
        for warning in retention_warnings(s):
            log.warning(warning)

    def step(self) -> float:
        if self.interval <= 0:  # disabled
            return 3600.0
        deleted = self.outbox.cleanup(self.keep_seconds, max_batches=MAX_CLEANUP_BATCHES_PER_STEP)
        self.deleted += deleted
        more = deleted >= MAX_CLEANUP_BATCHES_PER_STEP * get_settings().OUTBOX_CLEANUP_BATCH_SIZE
        return 0.0 if more else self.interval

    def close(self) -> None:
        pass


def worker_loops(using: str | None = None) -> list[OutboxDispatcher | OutboxCleanup]:
    """The outbox loops a worker process hosts: the background dispatcher and the
    clean-up, each unless its interval disables it; none when there is no outbox table."""
    s = get_settings()
    if not OutboxStore(using).exists():
        return []
    loops: list[OutboxDispatcher | OutboxCleanup] = []
    if s.OUTBOX_DISPATCHER_INTERVAL > 0:
        loops.append(OutboxDispatcher(using))
    if s.OUTBOX_CLEANUP_INTERVAL > 0:
        loops.append(OutboxCleanup(using))
    return loops
