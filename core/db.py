"""Database connection helpers, and the database's clock: the one clock every process shares
(a worker's own may be off)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any, Iterator, Sequence

from django.db import connections

from core.conf import get_settings
from core.dialects import dialect_for

_lock = threading.Lock()


def independent_alias(alias: str) -> str:
    """A second alias for the same database, so a transaction can run beside ``alias``'s.

    Copies the live settings of ``alias`` (under tests that is the test database).
    """
    name = f"{alias}__sluice_independent"
    with _lock:
        if name not in connections.settings:
            connections.settings[name] = dict(connections[alias].settings_dict)
    return name


class FairLock:
    """A first-come, first-served lock.  ``threading.Lock`` lets the thread that just
    released it take it straight back, which starves a waiter that wants it once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


_turns: dict[str, FairLock] = {}


def writer_turn(alias: str):
    """A context to wrap a write transaction in.  Where the database has one writer at a
    time (SQLite), the threads of this process take turns in arrival order instead of
    racing through the busy handler, whose growing sleeps let a busy pump starve the
    delayed mover; elsewhere it does nothing."""
    if dialect_for(connections[alias]).supports_concurrent_writers:
        return nullcontext()
    with _lock:
        return _turns.setdefault(alias, FairLock())


class StatementCursor:
    """A cursor for Sluice's own statements on the Django connection of an alias (so they
    run in whatever transaction is open there), with two things Django's cursor does not
    offer: ``execute(..., prepare=True)`` and parameters bound by the server.

    Where the dialect can (:attr:`Dialect.supports_server_binding`: PostgreSQL through
    psycopg 3), the statements go through a driver cursor of server-side binding on the
    connection Django already holds.  Django's own psycopg cursor binds on the client:
    it quotes every array element as text in Python, which was a third of a
    ``send_many``; bound by the server they travel as parameters, binary where the
    statement says ``%b``.  ``prepare=True`` (the hot statements: receive, peek, insert)
    makes it a server-side prepared statement of that connection unless
    ``SLUICE_PREPARED_STATEMENTS`` is off (PgBouncer in transaction mode hands a
    session's statements to other backends).  As with Django's cursor: driver errors
    become Django's (``wrap_database_errors``), a broken transaction is refused, the
    connection's ``execute_wrappers`` run around each statement, and statements are
    logged in ``connection.queries`` when Django logs them (DEBUG,
    ``CaptureQueriesContext``).  Elsewhere it is Django's cursor and ``prepare`` is
    ignored.
    """

    __slots__ = ("_db", "_cursor", "_server", "_prepare")

    def __init__(self, alias: str) -> None:
        db = connections[alias]
        d = dialect_for(db)
        self._db = db
        self._server = d.supports_server_binding
        if self._server:
            db.ensure_connection()
            self._prepare = d.supports_prepared_statements and get_settings().PREPARED_STATEMENTS
            self._cursor = d.server_cursor(db.connection, self._prepare)
        else:
            self._cursor = db.cursor()
            self._prepare = False

    @classmethod
    def around(cls, cursor: Any) -> "StatementCursor":
        """A StatementCursor over a Django cursor one already has (client-side binding,
        ``prepare`` ignored)."""
        self = cls.__new__(cls)
        self._db, self._cursor, self._server, self._prepare = cursor.db, cursor, False, False
        return self

    def execute(self, sql: str, params: Sequence[Any] = (), *, prepare: bool = False) -> "StatementCursor":
        if not self._server:
            self._cursor.execute(sql, params)
            return self
        self._wrapped(sql, params, partial(self._run, prepare=prepare))
        return self

    def copy_in(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Send ``rows`` to ``sql`` (a dialect's ``copy_in``: ``COPY … FROM STDIN``), as one
        statement of this connection's transaction.  Only on the server cursor
        (:attr:`Dialect.supports_copy_in`).

        A value the driver cannot send (a NUL or a lone surrogate in a string) raises
        ValueError before anything is sent, as a refused parameter does for
        :meth:`execute`: a COPY that failed half-way would end the transaction, and the
        caller could not write the rows again with those characters replaced."""
        texts = "".join([value for row in rows for value in row if type(value) is str])
        if "\x00" in texts:
            raise ValueError("a string holds a NUL character, which PostgreSQL's text cannot")
        texts.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
        self._wrapped(sql, (), partial(self._run_copy, rows=rows))

    def _wrapped(self, sql: str, params: Sequence[Any], run: Any) -> None:
        """``run(sql, params, many, context)`` inside the connection's execute wrappers."""
        db = self._db
        db.validate_no_broken_transaction()
        if db.execute_wrappers:
            for wrapper in reversed(db.execute_wrappers):
                run = partial(wrapper, run)
            run(sql, params, False, {"connection": db, "cursor": self})
        else:
            run(sql, params, False, None)

    def _run(self, sql: str, params: Sequence[Any], many: bool, context: Any, *, prepare: bool) -> None:
        with self._logged(sql), self._db.wrap_database_errors:
            self._cursor.execute(sql, params, prepare=prepare and self._prepare)

    def _run_copy(self, sql: str, params: Sequence[Any], many: bool, context: Any, *,
                  rows: Sequence[Sequence[Any]]) -> None:
        with self._logged(sql), self._db.wrap_database_errors, self._cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)

    @contextmanager
    def _logged(self, sql: str) -> Iterator[None]:
        """Log the statement in ``connection.queries`` when Django logs them."""
        db = self._db
        if not db.queries_logged:
            yield
            return
        started = time.monotonic()
        yield
        db.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})

    def fetchall(self) -> list[tuple[Any, ...]]:
        if not self._server:
            return self._cursor.fetchall()  # Django's cursor wraps its errors itself
        with self._db.wrap_database_errors:
            return self._cursor.fetchall()

    def fetchone(self) -> tuple[Any, ...] | None:
        if not self._server:
            return self._cursor.fetchone()
        with self._db.wrap_database_errors:
            return self._cursor.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def close(self) -> None:
        self._cursor.close()

    def __enter__(self) -> "StatementCursor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def database_now_us(using: str | None = None) -> int:
    """The database's clock, µs since the epoch: samples and monitoring periods are placed
    in the one clock every process shares."""
    using = using or get_settings().DATABASE
    d = dialect_for(connections[using], get_settings().SCHEMA)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])  # parameters (none): Django then reads %% as %
        now = d.to_datetime(cursor.fetchone()[0])
    return int(now.timestamp() * 1_000_000)
