"""The statements that remove a queue's rows other than the receive: one message by its
id, the expired ones (purged, or received for dead-lettering), all of them, and the table
lock a purge of everything takes.  Mixed into every dialect through core.dialects.base."""
from __future__ import annotations

import abc


class RemovalSQL(abc.ABC):
    """Written once where the fragments allow (:meth:`receive_expired`); each dialect
    supplies the rest.  Relies on the Dialect's identifiers, fragments and columns."""

    @abc.abstractmethod
    def delete_by_id(self, name: str) -> str:
        """Delete the message with Id %s unless a receiver holds it."""

    @abc.abstractmethod
    def purge_expired(self, name: str) -> str:
        """Delete up to %s expired rows, skipping locked ones; rowcount = rows deleted."""

    @abc.abstractmethod
    def purge_all(self, name: str) -> str:
        """Delete up to %s rows, skipping locked ones; rowcount = rows deleted."""

    def receive_expired(self, name: str) -> str:
        """Delete and return up to %s expired rows no receiver holds (for dead-lettering);
        columns as :meth:`receive`."""
        t = self.table(name)
        exp, rv = self._col("Expires"), self._col("RowVersion")
        rows = (f"SELECT {rv} FROM {t} WHERE {exp} IS NOT NULL "
                f"AND {exp} <= {self.now_sql()} ORDER BY {exp}{self.limit}{self.skip_locked_suffix}")
        return self.delete_locked(t, rv, rows, f"{self._message_columns()}, {self.expired_sql()}")

    def lock_table(self, name: str) -> str | None:
        """Lock a queue table against every other writer until the transaction ends
        (None: the transaction's own lock already does, as SQLite's BEGIN IMMEDIATE)."""
        return None
