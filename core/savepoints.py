"""Things held in memory until the end of a transaction that follow Django's savepoints.

A handler's sends are held until its chunk flushes them (core.receive.transaction_modes) or its
outbox record is stored (core.outbox.sender).  The handler may wrap work in its own
``transaction.atomic()`` and let it roll back: what it sent inside must go with it, and
with every atomic block nested in it, as its database writes do.

Django already keeps that bookkeeping for ``on_commit`` callbacks: each is tagged with
the savepoints open when it was registered, and rolling back a savepoint drops the
callbacks tagged with it (``BaseDatabaseWrapper.savepoint_rollback``).  So a run of held
items made under one savepoint registers a no-op callback, its *mark*; when the items
are taken, a run whose mark is gone was rolled back and is dropped.  Items made with no
savepoint open past the holder's ``base`` need no mark: only the holder's own scope can
roll them back, and that scope discards the holder as a whole — so the pump's usual
path (handlers that open no atomic block of their own) registers nothing.

:func:`savepoint_to_commit` is the pump's savepoint for a chunk: ``atomic()`` without
the RELEASE.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Generic, Iterable, Iterator, TypeVar

from django.db import Error, connections
from django.db.transaction import TransactionManagementError

T = TypeVar("T")


class _Mark:
    """A no-op on_commit callback whose presence says its savepoint was not rolled back."""

    __slots__ = ()

    def __call__(self) -> None:
        pass


def innermost_savepoint(savepoint_ids: list[str | None]) -> str | None:
    """The innermost real savepoint of Django's stack (``atomic(savepoint=False)`` pushes
    None: its work lives and dies with the block around it)."""
    for sid in reversed(savepoint_ids):
        if sid is not None:
            return sid
    return None


class SavepointHeld(Generic[T]):
    """Items held for the connection of ``using`` that a rolled-back savepoint drops.

    ``base``: the savepoint the holder's owner runs in (None: the whole transaction, or
    no owner savepoint known); items added with it innermost get no mark.  A holder
    belongs to the thread that made it (it keeps that thread's connection)."""

    __slots__ = ("using", "base", "items", "_runs", "_db")

    def __init__(self, using: str) -> None:
        self.using = using
        self._db = connections[using]
        self.base: str | None = None
        self.items: list[T] = []
        #: (index of the run's first item, its innermost savepoint, its mark or None)
        self._runs: list[tuple[int, str | None, _Mark | None]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, items: Iterable[T]) -> None:
        db = self._db
        sid = innermost_savepoint(db.savepoint_ids) if db.in_atomic_block else None
        if not self._runs or self._runs[-1][1] != sid:
            mark = None
            if sid is not None and sid != self.base:
                mark = _Mark()
                db.on_commit(mark)
            self._runs.append((len(self.items), sid, mark))
        self.items.extend(items)

    def survivors(self) -> list[T]:
        """The items whose savepoints were not rolled back (the holder is unchanged)."""
        if all(mark is None for _, _, mark in self._runs):
            return list(self.items)
        live = {id(func) for _, func, _ in self._db.run_on_commit}
        kept: list[T] = []
        ends = [start for start, _, _ in self._runs[1:]] + [len(self.items)]
        for (start, _, mark), end in zip(self._runs, ends):
            if mark is None or id(mark) in live:
                kept.extend(self.items[start:end])
        return kept

    def take(self) -> list[T]:
        """The surviving items; the holder is empty afterwards."""
        kept = self.survivors()
        self.clear()
        return kept

    def clear(self) -> None:
        self.items = []
        self._runs = []


@contextmanager
def savepoint_to_commit(using: str) -> Iterator[None]:
    """``transaction.atomic(using)`` inside an open transaction, less the RELEASE when the
    block succeeds: a round trip per receive batch on PostgreSQL, and the transaction's
    end frees the savepoint anyway.  Django sees the savepoint as atomic's (on_commit
    callbacks registered inside are tagged with it, atomic blocks inside nest in it).
    On an exception it rolls back to the savepoint, dropping those callbacks, and lets
    the exception through; a block that leaves the transaction marked for rollback (a
    failed ``atomic(savepoint=False)`` inside) is rolled back as a failure."""
    db = connections[using]
    if not db.in_atomic_block:
        raise TransactionManagementError("savepoint_to_commit() needs an open transaction")
    sid = db.savepoint()
    db.savepoint_ids.append(sid)
    try:
        yield
        if db.needs_rollback:
            raise TransactionManagementError("the block left its transaction marked for rollback")
    except BaseException:
        db.savepoint_ids.pop()
        db.needs_rollback = False  # (Django refuses every statement while it is set)
        try:
            db.savepoint_rollback(sid)
        except Error:
            db.needs_rollback = True  # the transaction as a whole must roll back
        raise
    db.savepoint_ids.pop()
