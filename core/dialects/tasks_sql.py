"""Named SQL of Django tasks' result rows (core.tasks, table ``sluice_task_result``): the
enqueue's INSERT and a chunk's UPDATE, hand-written because the ORM's compile of them cost
more than the statements (the ORM's bulk_update builds a CASE per field per row).
Mixed into every dialect; SQL Server's forms are :class:`MSSQLTaskSQL`'s."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

#: Rows per UPDATE: 3 parameters each, under SQL Server's 2,100 and SQLite's 32,766.
TASK_ROWS_PER_UPDATE = 500


class TaskSQL:
    """The result rows' statements; ``quote`` and ``now_sql`` come from the Dialect."""

    quote: Any
    now_sql: Any
    #: A JSON column's value from a text parameter (PostgreSQL: a cast to jsonb).
    json_cast = "{}"
    #: A JSON column read as its text (PostgreSQL: a cast to text, so that the driver does
    #: not parse it: a new task's "[]" needs no parse, core.tasks.results._json).
    json_text = "{}"

    def instant(self, expression: str) -> str:
        """A timestamp expression in the form the driver reads fastest, for
        ``Dialect.to_datetime``: the expression itself here."""
        return expression

    def insert_returning(self, table: str, columns: Sequence[str], returning: str,
                         literals: Mapping[str, str] | None = None) -> str:
        """INSERT one row into a table of Django's (not a queue: no schema of Sluice's), one
        ``%s`` per column, then each of ``literals`` (column → SQL text, the same in every
        row: fewer parameters to send), returning the stored ``returning`` timestamp column
        (a database default, as the database wrote it; read with ``to_datetime``)."""
        names, values = self._insert_values(columns, literals)
        return (f"INSERT INTO {self.quote(table)} ({names}) VALUES ({values}) "
                f"RETURNING {self.instant(self.quote(returning))}")

    def _insert_values(self, columns: Sequence[str], literals: Mapping[str, str] | None) -> tuple[str, str]:
        literals = literals or {}
        names = ", ".join(self.quote(c) for c in [*columns, *literals])
        return names, ", ".join([*(["%s"] * len(columns)), *literals.values()])

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
        marks = ", ".join(["%s"] * len(ids))
        return f"{self._task_results_select(table)} IN ({marks})", list(ids)

    def _task_results_select(self, table: str) -> str:
        q, instant = self.quote, self.instant
        return (f"SELECT {q('id')}, {instant(q('enqueued_at'))}, {instant(q('started_at'))}, "
                f"{self.json_text.format(q('errors'))}, {self.json_text.format(q('worker_ids'))}, "
                f"{instant(self.now_sql())} FROM {q(table)} WHERE {q('id')}")

    def task_results_update(self, table: str, times: list[Any],
                            rows: list[tuple[str, str, str | None]]) -> tuple[str, list[Any]]:
        """:meth:`update_task_results` with its parameters, for at most TASK_ROWS_PER_UPDATE
        ``rows``: (sql, params)."""
        return self.update_task_results(table, len(rows)), [*times, *(v for row in rows for v in row)]


class PostgreSQLTaskSQL(TaskSQL):
    """PostgreSQL: a chunk's ids and results as array parameters, one statement text for
    every chunk size.  Binary arrays (``%b``, as the queue inserts send theirs): a text array
    of 100 ids cost the driver about 190 µs of CPU to write, the binary one 60."""

    def instant(self, expression: str) -> str:
        # Microseconds since the epoch as an int8: the driver's integer loader is C, its
        # timestamptz loader under Django Python (a tenth of an enqueue).  extract() is
        # exact (numeric) since PostgreSQL 14, and rounds to the microsecond before it.
        return f"(extract(epoch FROM {expression}) * 1000000)::int8"

    def task_results_read(self, table: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
        # One probe of the key per id, driven by the chunk's ids: a lateral subquery the
        # planner cannot pull up (OFFSET 0).  "id = ANY(ids)" was planned as a sequential
        # scan of the whole table until it held some tens of thousands of rows (the default
        # random_page_cost prices 100 probes above it): 2.7 ms per chunk of 100 at 20,000
        # rows, where the probes take 0.3 ms.  tests/test_tasks_plans.py holds this.
        return (f"SELECT r.* FROM unnest(%b::text[]) AS v(rid) CROSS JOIN LATERAL "
                f"({self._task_results_select(table)} = v.rid OFFSET 0) r"), [list(ids)]

    def task_results_update(self, table: str, times: list[Any],
                            rows: list[tuple[str, str, str | None]]) -> tuple[str, list[Any]]:
        t = self.quote(table)
        # The join's key compare is "= ANY(ARRAY[v.rid])", which cannot be hashed: the plan
        # is the chunk's rows probing the key, one by one.  With "id = v.rid" the planner
        # hashed a sequential scan of the whole table until it held some tens of thousands
        # of rows (as for the read above): 3-4 ms per chunk of 100 at 20,000, against 1 ms.
        sql = (f"UPDATE {t} SET {self._task_sets('v')} "
               "FROM unnest(%b::text[], %b::text[], %b::text[]) AS v(rid, wids, value) "
               f"WHERE {t}.{self.quote('id')} = ANY(ARRAY[v.rid])")
        ids, wids, values = (list(column) for column in zip(*rows))
        return sql, [*times, ids, wids, values]


class MSSQLTaskSQL(TaskSQL):
    """SQL Server: OUTPUT for RETURNING, UPDATE … FROM with a join."""

    def insert_returning(self, table: str, columns: Sequence[str], returning: str,
                         literals: Mapping[str, str] | None = None) -> str:
        names, values = self._insert_values(columns, literals)
        return (f"SET NOCOUNT ON; INSERT INTO {self.quote(table)} ({names}) "
                f"OUTPUT {self.instant('inserted.' + self.quote(returning))} VALUES ({values})")

    def update_task_results(self, table: str, rows: int) -> str:
        t = self.quote(table)
        return (f"UPDATE r SET {self._task_sets('v')} FROM {t} r JOIN ({self._task_rows(rows)}) v "
                f"ON r.{self.quote('id')} = v.rid")
