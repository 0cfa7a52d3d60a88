"""Named SQL of the failed-message counts the database keeps: per status and group
(``sluice_failed_group``, core.models.FailedGroup: with the group's first and last time of
failure, title and exception type) and per status and queue (``sluice_failed_queue``,
core.models.FailedQueueCount).  Triggers on ``sluice_failed_message`` keep them in the
transaction of each insert, update and delete, whoever writes it (ingestion, retries,
archiving, deletes, a purge, raw SQL).

Why triggers: the groups page listed the largest of a million records' groups by grouping
them all (0.8 s however it was indexed), and the overview counted each queue's failed
messages up to a cap and asked the planner for the rest; a count read from its own row costs
what the page shows, and is exact.  A count goes up and down by the rows each statement adds
and removes; a touched group's first and last times are read again from the index
``sluice_fm_status_groups`` (two probes), because a removed record may have been either.  A
decrement never adds a row: where the count rows are gone first (a test's flush), removing
records leaves nothing behind.

Concurrent writers to one group or queue queue on its count row, so a trigger that reads the
group's first and last after taking that row sees every record committed before it.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field

FAILED_TABLE = "sluice_failed_message"
GROUP_TABLE = "sluice_failed_group"
QUEUE_TABLE = "sluice_failed_queue"
#: The trigger names (PostgreSQL: also the function's), for dropping them.
TRIGGER = "sluice_fm_counts"


@dataclass(frozen=True)
class Tally:
    """One kept count: ``table`` holds a row per status and ``key`` (the record's ``source``)."""

    table: str
    key: str
    source: str
    #: Columns copied from the newest record written (count column → record column).
    copied: dict[str, str] = field(default_factory=dict)
    #: The first and last time_of_failure are kept too.
    times: bool = False


GROUPS = Tally(GROUP_TABLE, "group_key", "group_key", {"title": "group_title", "exception_type": "exception_type"},
               times=True)
QUEUES = Tally(QUEUE_TABLE, "queue", "original_queue")
TALLIES = (GROUPS, QUEUES)
#: The record columns whose change moves a record from one count to another.
COUNTED_COLUMNS = ("status", "group_key", "original_queue", "time_of_failure")


def backfill() -> list[str]:
    """Every count made afresh from the records: the migration's starting point."""
    statements = []
    for t in TALLIES:
        columns = ["status", t.key, "records", *(["first_failed", "last_failed"] if t.times else []), *t.copied]
        values = ["status", t.source, "COUNT(*)", *(["MIN(time_of_failure)", "MAX(time_of_failure)"] if t.times else []),
                  *(f"MAX({source})" for source in t.copied.values())]
        statements.append(f"INSERT INTO {t.table} ({', '.join(columns)}) SELECT {', '.join(values)} "
                          f"FROM {FAILED_TABLE} GROUP BY status, {t.source}")
    return statements


def _first_and_last(row: str) -> str:
    """SET clause: a group's first and last time of failure, from index probes; ``row``
    names the count row being updated (its alias, or the table)."""
    probe = (f"(SELECT {{f}}(m.time_of_failure) FROM {FAILED_TABLE} m "
             f"WHERE m.status = {row}.status AND m.group_key = {row}.group_key)")
    return f"first_failed = {probe.format(f='MIN')}, last_failed = {probe.format(f='MAX')}"


def _copied(t: Tally, value: str) -> str:
    """``, col = <value of col>`` for the copied columns (``value`` formats a column name)."""
    return "".join(f", {column} = {value.format(column)}" for column in t.copied)


class FailedCountsSQL(abc.ABC):
    """The statements that install and remove the triggers (each dialect's own, below)."""

    @abc.abstractmethod
    def failed_count_triggers(self) -> list[str]:
        """CREATE statements, run in order by migration 0018."""

    @abc.abstractmethod
    def drop_failed_count_triggers(self) -> list[str]:
        """DROP statements undoing :meth:`failed_count_triggers`."""


class PostgreSQLFailedCountsSQL(FailedCountsSQL):
    """Statement-level triggers with transition tables: one pass per statement, however many
    rows it wrote (a bulk insert of 2,000 records is one upsert per count table)."""

    def failed_count_triggers(self) -> list[str]:
        def taken(t: Tally) -> str:
            return (f"UPDATE {t.table} c SET records = c.records - o.n FROM (SELECT status, {t.source} AS k, "
                    f"COUNT(*) AS n FROM old_rows GROUP BY status, {t.source}) o "
                    f"WHERE c.status = o.status AND c.{t.key} = o.k;")

        def added(t: Tally) -> str:
            columns = ", ".join(["status", t.key, "records", *t.copied])
            values = ", ".join(["status", t.source, "COUNT(*)", *(f"MAX({s})" for s in t.copied.values())])
            # In key order, so that two statements take their count rows' locks in one order.
            return (f"INSERT INTO {t.table} AS c ({columns}) SELECT {values} FROM new_rows "
                    f"GROUP BY status, {t.source} ORDER BY status, {t.source} ON CONFLICT (status, {t.key}) "
                    f"DO UPDATE SET records = c.records + excluded.records{_copied(t, 'excluded.{}')};")

        def touched(source: str) -> str:
            return (f"UPDATE {GROUP_TABLE} c SET {_first_and_last('c')} FROM (SELECT DISTINCT status, group_key "
                    f"FROM {source}) t WHERE c.status = t.status AND c.group_key = t.group_key;")

        take = " ".join(taken(t) for t in TALLIES)
        add = " ".join(added(t) for t in TALLIES)
        function = (
            f"CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $body$ BEGIN "
            f"IF TG_OP = 'INSERT' THEN {add} {touched('new_rows')} "
            f"ELSIF TG_OP = 'DELETE' THEN {take} {touched('old_rows')} "
            f"ELSE {take} {add} {touched('old_rows')} {touched('new_rows')} "
            f"END IF; RETURN NULL; END $body$")
        # Transition tables allow one event per trigger (and no column list).
        return [function] + [
            f"CREATE TRIGGER {TRIGGER}_{event.lower()} AFTER {event} ON {FAILED_TABLE} "
            f"REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION {TRIGGER}()"
            for event, tables in (("INSERT", "NEW TABLE AS new_rows"), ("DELETE", "OLD TABLE AS old_rows"),
                                  ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"))]

    def drop_failed_count_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{event} ON {FAILED_TABLE}" for event in ("insert", "delete", "update")
                ] + [f"DROP FUNCTION IF EXISTS {TRIGGER}()"]


class SQLiteFailedCountsSQL(FailedCountsSQL):
    """Row-level triggers (SQLite has no other kind); one writer at a time, so no locking."""

    def failed_count_triggers(self) -> list[str]:
        def take(row: str) -> str:
            return " ".join(f"UPDATE {t.table} SET records = records - 1 "
                            f"WHERE status = {row}.status AND {t.key} = {row}.{t.source};" for t in TALLIES)

        def add(row: str) -> str:
            return " ".join(
                f"INSERT INTO {t.table} ({', '.join(['status', t.key, 'records', *t.copied])}) "
                f"VALUES ({', '.join([f'{row}.status', f'{row}.{t.source}', '1', *(f'{row}.{s}' for s in t.copied.values())])}) "
                f"ON CONFLICT (status, {t.key}) DO UPDATE SET records = records + 1{_copied(t, 'excluded.{}')};"
                for t in TALLIES)

        def touched(row: str) -> str:
            # No alias: a trigger's UPDATE takes none.
            return (f"UPDATE {GROUP_TABLE} SET {_first_and_last(GROUP_TABLE)} "
                    f"WHERE status = {row}.status AND group_key = {row}.group_key;")

        return [
            f"CREATE TRIGGER {TRIGGER}_insert AFTER INSERT ON {FAILED_TABLE} BEGIN {add('NEW')} {touched('NEW')} END",
            f"CREATE TRIGGER {TRIGGER}_delete AFTER DELETE ON {FAILED_TABLE} BEGIN {take('OLD')} {touched('OLD')} END",
            f"CREATE TRIGGER {TRIGGER}_update AFTER UPDATE OF {', '.join(COUNTED_COLUMNS)} ON {FAILED_TABLE} "
            f"BEGIN {take('OLD')} {add('NEW')} {touched('OLD')} {touched('NEW')} END",
        ]

    def drop_failed_count_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{event}" for event in ("insert", "delete", "update")]


class MSSQLFailedCountsSQL(FailedCountsSQL):
    """One AFTER trigger for the three events, over its ``inserted`` and ``deleted`` tables;
    MERGE … HOLDLOCK so two first records of a new group or queue do not both insert its row."""

    def failed_count_triggers(self) -> list[str]:
        def taken(t: Tally) -> str:
            return (f"UPDATE c SET records = c.records - o.n FROM {t.table} c JOIN (SELECT status, {t.source} AS k, "
                    f"COUNT(*) AS n FROM deleted GROUP BY status, {t.source}) o "
                    f"ON c.status = o.status AND c.{t.key} = o.k;")

        def merged(t: Tally) -> str:
            picked = "".join(f", MAX({source}) AS {column}" for column, source in t.copied.items())
            columns = ", ".join(["status", t.key, "records", *t.copied])
            values = ", ".join(["i.status", "i.k", "i.n", *(f"i.{column}" for column in t.copied)])
            return (f"MERGE {t.table} WITH (HOLDLOCK) AS c USING (SELECT status, {t.source} AS k, COUNT(*) AS n{picked} "
                    f"FROM inserted GROUP BY status, {t.source}) AS i ON c.status = i.status AND c.{t.key} = i.k "
                    f"WHEN MATCHED THEN UPDATE SET records = c.records + i.n{_copied(t, 'i.{}')} "
                    f"WHEN NOT MATCHED THEN INSERT ({columns}) VALUES ({values});")

        return [
            f"CREATE TRIGGER {TRIGGER} ON {FAILED_TABLE} AFTER INSERT, UPDATE, DELETE AS BEGIN SET NOCOUNT ON; "
            + " ".join(taken(t) for t in TALLIES) + " " + " ".join(merged(t) for t in TALLIES) + " "
            f"UPDATE c SET {_first_and_last('c')} FROM {GROUP_TABLE} c JOIN (SELECT status, group_key FROM deleted "
            f"UNION SELECT status, group_key FROM inserted) t ON c.status = t.status AND c.group_key = t.group_key; "
            f"END"]

    def drop_failed_count_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}"]
