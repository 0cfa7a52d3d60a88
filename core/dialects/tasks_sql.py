"""Named SQL of Django tasks' result rows (core.tasks, table ``sluice_task_result``): the
enqueue's INSERT and a chunk's UPDATE, hand-written because the ORM's compile of them cost
more than the statements (the ORM's bulk_update builds a CASE per field per row).
Mixed into every dialect; SQL Server's forms are :class:`MSSQLTaskSQL`'s."""
from __future__ import annotations

from typing import Any, Sequence

#: Rows per UPDATE: 3 parameters each, under SQL Server's 2,100 and SQLite's 32,766.
TASK_ROWS_PER_UPDATE = 500


class TaskSQL:
    """The result rows' statements; ``quote`` and ``now_sql`` come from the Dialect."""

    quote: Any
    now_sql: Any
    #: A JSON column's value from a text parameter (PostgreSQL: a cast to jsonb).
    json_cast = "{}"

    def insert_returning(self, table: str, columns: Sequence[str], returning: str) -> str:
        """INSERT one row into a table of Django's (not a queue: no schema of Sluice's), one
        ``%s`` per column, returning the stored ``returning`` column (a database default,
        as the database wrote it)."""
        names = ", ".join(self.quote(c) for c in columns)
        marks = ", ".join(["%s"] * len(columns))
        return f"INSERT INTO {self.quote(table)} ({names}) VALUES ({marks}) RETURNING {self.quote(returning)}"

    def _task_rows(self, rows: int) -> str:
        # A derived table every dialect reads the same way (SQLite has no VALUES column list).
        first = "SELECT %s AS rid, %s AS wids, %s AS value"
        return " UNION ALL ".join([first] + ["SELECT %s, %s, %s"] * (rows - 1))

    def _task_sets(self, alias: str) -> str:
        q = self.quote
        return (f"{q('status')} = %s, {q('started_at')} = COALESCE({q('started_at')}, %s), "
                f"{q('last_attempted_at')} = %s, {q('finished_at')} = %s, "
                f"{q('worker_ids')} = {self.json_cast.format(alias + '.wids')}, "
                f"{q('return_value')} = {self.json_cast.format(alias + '.value')}")

    def update_task_results(self, table: str, rows: int) -> str:
        """``rows`` results in one UPDATE: status, started_at if unset, last_attempted_at and
        finished_at the same for all; per row its id, worker_ids (JSON text) and return_value
        (JSON text or NULL).  Params: status, started, started, finished, then id,
        worker_ids, return_value per row."""
        t = self.quote(table)
        return (f"UPDATE {t} SET {self._task_sets('v')} FROM ({self._task_rows(rows)}) v "
                f"WHERE {t}.{self.quote('id')} = v.rid")

    def task_results_read(self, table: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
        """A chunk's result rows (id, enqueued_at, started_at, errors, worker_ids) and the
        database's now in each row: (sql, params)."""
        q = self.quote
        marks = ", ".join(["%s"] * len(ids))
        return (f"SELECT {q('id')}, {q('enqueued_at')}, {q('started_at')}, {q('errors')}, {q('worker_ids')}, "
                f"{self.now_sql()} FROM {q(table)} WHERE {q('id')} IN ({marks})", list(ids))

    def task_results_update(self, table: str, times: list[Any],
                            rows: list[tuple[str, str, str | None]]) -> tuple[str, list[Any]]:
        """:meth:`update_task_results` with its parameters, for at most TASK_ROWS_PER_UPDATE
        ``rows``: (sql, params)."""
        return self.update_task_results(table, len(rows)), [*times, *(v for row in rows for v in row)]


class PostgreSQLTaskSQL(TaskSQL):
    """PostgreSQL: a chunk's ids and results as array parameters, one statement text for
    every chunk size (prepared once, where a list or derived table of N rows was parsed and
    planned anew for every chunk)."""

    def task_results_read(self, table: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
        q = self.quote
        return (f"SELECT {q('id')}, {q('enqueued_at')}, {q('started_at')}, {q('errors')}, {q('worker_ids')}, "
                f"{self.now_sql()} FROM {q(table)} WHERE {q('id')} = ANY(%s::text[])", [list(ids)])

    def task_results_update(self, table: str, times: list[Any],
                            rows: list[tuple[str, str, str | None]]) -> tuple[str, list[Any]]:
        t = self.quote(table)
        sql = (f"UPDATE {t} SET {self._task_sets('v')} "
               "FROM unnest(%s::text[], %s::text[], %s::text[]) AS v(rid, wids, value) "
               f"WHERE {t}.{self.quote('id')} = v.rid")
        ids, wids, values = (list(column) for column in zip(*rows))
        return sql, [*times, ids, wids, values]


class MSSQLTaskSQL(TaskSQL):
    """SQL Server: OUTPUT for RETURNING, UPDATE … FROM with a join."""

    def insert_returning(self, table: str, columns: Sequence[str], returning: str) -> str:
        names = ", ".join(self.quote(c) for c in columns)
        marks = ", ".join(["%s"] * len(columns))
        return (f"SET NOCOUNT ON; INSERT INTO {self.quote(table)} ({names}) "
                f"OUTPUT inserted.{self.quote(returning)} VALUES ({marks})")

    def update_task_results(self, table: str, rows: int) -> str:
        t = self.quote(table)
        return (f"UPDATE r SET {self._task_sets('v')} FROM {t} r JOIN ({self._task_rows(rows)}) v "
                f"ON r.{self.quote('id')} = v.rid")
