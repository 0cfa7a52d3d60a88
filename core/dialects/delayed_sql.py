"""Named SQL of the delayed-message store (core/delayed): mixed into every dialect."""
from __future__ import annotations

import abc
from typing import Any

#: Columns of the delayed-message store, in the order its SELECTs return them.
DELAYED_COLUMNS = ("Id", "Destination", "State", "Time", "Headers", "RetryCount")


class DelayedSQL(abc.ABC):
    """Named SQL of the delayed-message store (table ``Id, Destination, State, Time,
    Headers, RetryCount`` with an index on Time).  Mixed into every dialect; the
    generic forms below are overridden where a database differs."""

    # Provided by Dialect.
    table: Any
    quote: Any
    now_sql: Any
    expires_after_ttl_sql: Any
    schema: str | None
    limit: str
    nolock_hint: str
    lock_skip_hint: str
    skip_locked_suffix: str

    def _delayed_columns(self) -> str:
        return ", ".join(self.quote(c) for c in DELAYED_COLUMNS)

    @abc.abstractmethod
    def create_delayed_table(self, name: str) -> list[tuple[str, list[Any]]]:
        """Idempotent statements that create the store table and its index on Time."""

    def delayed_insert_at(self, name: str) -> str:
        """Store a message due at an explicit time, unless its Id is already stored.
        Params: id, destination, state, time, headers.  Returns the stored Time (no row
        when the Id was already there)."""
        return self.delayed_insert_many(name, 1, after=False)

    def delayed_insert_after(self, name: str) -> str:
        """Like delayed_insert_at, due at database now + a delay given by ttl_params."""
        return self.delayed_insert_many(name, 1, after=True)

    def delayed_insert_many(self, name: str, count: int, after: bool) -> str:
        """Store ``count`` messages in ONE statement, skipping Ids already stored; returns
        the stored Times.  ``after``: due at database now + ttl_params, else at a given
        time.  Params: :meth:`delayed_insert_many_params`."""
        when = self.expires_after_ttl_sql() if after else "%s"
        rows = ", ".join([f"(%s, %s, %s, {when}, %s, 0)"] * count)
        return (
            f"INSERT INTO {self.table(name)} ({self._delayed_columns()}) VALUES {rows} "
            f"ON CONFLICT ({self.quote('Id')}) DO NOTHING RETURNING {self.quote('Time')}"
        )

    def delayed_insert_params(self, id_: str, destination: str, state: bytes, time_params: list[Any],
                              headers: str) -> list[Any]:
        return [id_, destination, state, *time_params, headers]

    def delayed_insert_many_params(self, rows: list[tuple[str, str, bytes, list[Any], str]]) -> list[Any]:
        """The parameters of :meth:`delayed_insert_many` for (id, destination, state,
        time params, headers) rows."""
        return [p for id_, dest, state, when, headers in rows for p in (id_, dest, state, *when, headers)]

    def delayed_fetch_due(self, name: str) -> str:
        """Up to N messages due at a time (NULL: the database's now), earliest first,
        locked against other movers.  Params: delayed_fetch_params(at, limit)."""
        time = self.quote("Time")
        return (
            f"SELECT {self._delayed_columns()} FROM {self.table(name)}{self.lock_skip_hint} "
            f"WHERE {time} <= COALESCE(%s, {self.now_sql()}) ORDER BY {time}{self.limit}{self.skip_locked_suffix}"
        )

    def delayed_fetch_params(self, at: Any, limit: int) -> list[Any]:
        return [at, limit]

    def delayed_claim_due(self, name: str) -> str:
        """Delete and return up to N messages due at a time (NULL: the database's now),
        passing over rows another mover holds — the mover's fetch and remove in one
        statement.  Rows come back in no particular order.  Params:
        delayed_claim_params(at, limit)."""
        time, id_ = self.quote("Time"), self.quote("Id")
        t = self.table(name)
        rows = (f"SELECT {id_} FROM {t} WHERE {time} <= COALESCE(%s, {self.now_sql()}) "
                f"ORDER BY {time}{self.limit}{self.skip_locked_suffix}")
        return self.delete_locked(t, id_, rows, self._delayed_columns())

    def delayed_claim_params(self, at: Any, limit: int) -> list[Any]:
        return [at, limit]

    def delayed_claim_due_and_next(self, name: str) -> str:
        """:meth:`delayed_claim_due`, each row followed by two columns: the earliest due
        time among the rows it did not take (NULL: none) and the database's now.  With
        nothing due it returns one row of NULLs followed by those two.  Params:
        delayed_claim_params(at, limit).  Only where ``supports_claim_with_next``."""
        raise NotImplementedError(f"{type(self).__name__} claims and asks the next due time apart "
                                  "(supports_claim_with_next)")

    def delayed_remove(self, name: str) -> str:
        return f"DELETE FROM {self.table(name)} WHERE {self.quote('Id')} = %s"

    def delayed_remove_many(self, name: str, count: int) -> str:
        """Delete ``count`` stored messages by Id in one statement.  Params: the ids
        (callers keep ``count`` within ``max_parameters``)."""
        marks = ", ".join(["%s"] * count)
        return f"DELETE FROM {self.table(name)} WHERE {self.quote('Id')} IN ({marks})"

    def delayed_increment_failure(self, name: str) -> str:
        rc = self.quote("RetryCount")
        return f"UPDATE {self.table(name)} SET {rc} = {rc} + 1 WHERE {self.quote('Id')} = %s"

    def delayed_next(self, name: str) -> str:
        """One row: (earliest due time or NULL, the database's now)."""
        return f"SELECT {self.edge(self.quote('Time'), self.table(name))}, {self.now_sql()}"

    def delayed_list(self, name: str, bodies: bool = True) -> str:
        """Up to %s stored messages by due time, with the database's now.  Not locked.
        Without ``bodies`` the State column holds its size in bytes (an operator's listing)."""
        columns = self._delayed_columns()
        if not bodies:
            columns = columns.replace(self.quote("State"), f"{self.byte_length_function}({self.quote('State')})")
        return (
            f"SELECT {columns}, {self.now_sql()} FROM {self.table(name)}{self.nolock_hint} "
            f"ORDER BY {self.quote('Time')}, {self.quote('Id')}{self.limit}"
        )

    def delayed_deliver_now(self, name: str) -> str:
        """Make one stored message due now.  Params: id."""
        return f"UPDATE {self.table(name)} SET {self.quote('Time')} = {self.now_sql()} WHERE {self.quote('Id')} = %s"

    def rename_delayed_table(self, old: str, new: str) -> list[tuple[str, list[Any]]]:
        """Rename a store table (keeping its rows) and drop its old-named index; the
        create statements then make the index under its new name."""
        index = self.quote(self.delayed_time_index(old))
        if self.schema:
            index = f"{self.quote(self.schema)}.{index}"
        return [(f"ALTER TABLE {self.table(old)} RENAME TO {self.quote(new)}", []),
                (f"DROP INDEX IF EXISTS {index}", [])]

    def delayed_has_destination(self, name: str) -> str:
        """A row when some stored message is for destination %s."""
        return (f"SELECT 1 WHERE EXISTS (SELECT 1 FROM {self.table(name)}{self.nolock_hint} "
                f"WHERE {self.quote('Destination')} = %s)")

    def notify(self) -> str | None:
        """A statement that wakes listeners on channel %s with payload %s at commit."""
        return None
