"""Named SQL the dashboard's statistics and failed-message search read (dashboard/counting/stats.py,
core/failures): mixed into every dialect.  Bounded: never a full count of a big table."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


class DashboardSQL:
    """The dashboard's statements; the fragments and helpers come from :class:`Dialect`."""

    #: Error codes of a statement the database stopped because :meth:`bounded`'s time ran out.
    statement_timeout_errors: frozenset[str] = frozenset()

    def statement_timeout(self, seconds: float) -> tuple[str, list[Any]] | None:
        """A statement that makes the database cancel every later statement of the session
        that runs longer than ``seconds``; None where there is none."""
        return None

    def statement_timeout_reset(self) -> tuple[str, list[Any]] | None:
        """The statement that lifts :meth:`statement_timeout` again."""
        return None

    @contextlib.contextmanager
    def bounded(self, connection: Any, seconds: float) -> Iterator[None]:
        """On Django ``connection`` (in autocommit: no transaction to abort, so a view that
        catches a database error can go on), statements are cancelled past ``seconds`` each
        while the block runs: a dashboard page must not hold a worker and the database for
        minutes.  :meth:`is_statement_timeout` tells such a cancel from other errors.

        The session setting is made just before the block's first statement, so a request
        that makes none (a page from the cache, an anonymous health check) costs no round
        trip, and lifted at the end only when it was made: the connection's next user (an
        action, a test's clean-up, the next request on a kept connection) is not bounded."""
        statement = self.statement_timeout(seconds)
        if statement is None:
            yield
            return
        made = False

        def set_first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal made
            if not made:
                made = True  # first: the SET below passes through this wrapper too
                with connection.cursor() as cursor:
                    cursor.execute(*statement)
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(set_first):
                yield
        finally:
            if made and connection.connection is not None:  # a closed connection forgot it anyway
                with connection.cursor() as cursor:
                    cursor.execute(*self.statement_timeout_reset())

    def is_statement_timeout(self, exc: BaseException) -> bool:
        return self._has_code(exc, self.statement_timeout_errors)

    def queue_stats(self, names: list[str]) -> str:
        """One row per queue of ``names`` (UNION ALL): (position, min RowVersion, max RowVersion,
        rows counted up to a cap, expired rows counted up to a cap, Headers of the oldest row,
        now).  Params: :meth:`queue_stats_params`."""
        return self._queue_rows(names, expired=True)

    def _queue_rows(self, names: list[str], expired: bool, cap: int | None = None) -> str:
        """The rows of :meth:`queue_stats` (``expired``) or :meth:`queue_levels`; with ``cap``
        the positions and the cap are written in as integers, not bound (see queue_levels)."""
        rv, exp = self._col("RowVersion"), self._col("Expires")
        limit = "%s" if cap is None else str(int(cap))
        parts = []
        for position, name in enumerate(names):
            t = self.table(name)
            expired_count = (f"(SELECT COUNT(*) FROM (SELECT 1 AS x FROM {t} WHERE {exp} IS NOT NULL AND "
                             f"{exp} <= {self.now_sql()} LIMIT %s) e), ") if expired else ""
            parts.append(
                f"SELECT {'%s' if cap is None else position}, {self.edge(rv, t)}, {self.edge(rv, t, last=True)}, "
                f"(SELECT COUNT(*) FROM (SELECT 1 AS x FROM {t} LIMIT {limit}) c), {expired_count}"
                f"(SELECT {self._col('Headers')} FROM {t} ORDER BY {rv} LIMIT 1), {self.now_sql()}")
        return " UNION ALL ".join(parts)

    def queue_stats_params(self, count: int, cap: int) -> list[Any]:
        return [v for i in range(count) for v in (i, cap, cap)]

    def _capped_count(self, source: str, where: str) -> str:
        """A scalar subquery counting rows of ``source`` + ``where`` up to %s (then it stops)."""
        return f"(SELECT COUNT(*) FROM (SELECT 1 AS x FROM {source}{where} LIMIT %s) c)"

    def browse_sizes(self, name: str) -> str:
        """:meth:`browse` with each Body's size in bytes in its place: a listing of 4 MiB
        bodies reads integers, not bodies.  Params: :meth:`browse_params`."""
        body = self._col("Body")
        return self.browse(name).replace(body, f"{self.byte_length_function}({body})", 1)

    def queue_levels(self, names: list[str], cap: int) -> str:
        """What alert rules and live monitoring read (core.monitoring.measurements), cheaper than
        :meth:`queue_stats`: no expired count.  One row per queue (UNION ALL): (position, min
        RowVersion, max RowVersion, rows counted up to ``cap``, Headers of the oldest row, now).
        No parameters: positions and the cap are integers written into the text, so that the
        prepared statement gets a generic plan.  With them bound, PostgreSQL planned it afresh
        on every execution, and planning 100 queues' subqueries cost four times the reading."""
        return self._queue_rows(names, expired=False, cap=cap)

    def failed_search_expression(self) -> str | None:
        """An SQL expression over a sluice_failed_message row that free-text search matches
        with ``LIKE '%TEXT%'`` (upper case), when the database can index it; None: search
        compares the columns one by one."""
        return None

    def failed_search_indexes(self) -> list[tuple[str, list[Any]]]:
        """Statements that index :meth:`failed_search_expression` (none without one)."""
        return []

    def delayed_stats(self, name: str) -> str:
        """Per destination among the %s earliest delayed messages: (destination, due now, all)."""
        c = self._col
        return (f"SELECT {c('Destination')}, SUM(CASE WHEN {c('Time')} <= {self.now_sql()} THEN 1 ELSE 0 END), "
                f"COUNT(*) FROM (SELECT {c('Destination')}, {c('Time')} FROM {self.table(name)} "
                f"ORDER BY {c('Time')} LIMIT %s) d GROUP BY {c('Destination')}")

