"""Named SQL of the failed-message group counts (``sluice_failed_group``, core.models.FailedGroup):
triggers on ``sluice_failed_message`` that keep, per status and group, how many records
there are and the first and last time of failure, in the transaction of each insert, update
and delete, whoever writes it (ingestion, retries, archiving, deletes, a purge, raw SQL).

Why triggers: the groups page listed the largest of a million records' groups by grouping
them all, 0.8 s however it was indexed; a group count read from its own row costs what the
page shows.  A count goes up and down by the rows each statement adds and removes; the first
and last times of a touched group are read again from the index ``sluice_fm_status_groups``
(two probes), because a removed record may have been either.  A decrement never adds a row:
where the count rows are gone first (a test's flush), removing records leaves nothing behind.

Concurrent writers to one group queue on its count row, so a trigger that reads the group's
first and last after taking that row sees every record committed before it.
"""
from __future__ import annotations

FAILED_TABLE = "sluice_failed_message"
GROUP_TABLE = "sluice_failed_group"
#: The trigger names (PostgreSQL: also the function's), for dropping them.
TRIGGER = "sluice_fm_groups"

#: Every group counted afresh from the records: the migration's starting point.
BACKFILL = (f"INSERT INTO {GROUP_TABLE} (status, group_key, records, first_failed, last_failed, title, exception_type) "
            f"SELECT status, group_key, COUNT(*), MIN(time_of_failure), MAX(time_of_failure), MAX(group_title), "
            f"MAX(exception_type) FROM {FAILED_TABLE} GROUP BY status, group_key")


def _first_and_last(group: str) -> str:
    """SET clause: the group's first and last time of failure, from index probes; ``group``
    names the count row being updated (its alias, or the table)."""
    probe = (f"(SELECT {{f}}(m.time_of_failure) FROM {FAILED_TABLE} m "
             f"WHERE m.status = {group}.status AND m.group_key = {group}.group_key)")
    return f"first_failed = {probe.format(f='MIN')}, last_failed = {probe.format(f='MAX')}"


class FailedGroupsSQL:
    """The statements that install and remove the triggers (each dialect's own)."""

    def failed_group_triggers(self) -> list[str]:
        raise NotImplementedError

    def drop_failed_group_triggers(self) -> list[str]:
        raise NotImplementedError


class PostgreSQLFailedGroupsSQL(FailedGroupsSQL):
    """Statement-level triggers with transition tables: one pass per statement, however many
    rows it wrote (a bulk insert of 2,000 records is one upsert of its groups)."""

    def failed_group_triggers(self) -> list[str]:
        taken = (f"UPDATE {GROUP_TABLE} g SET records = g.records - o.n FROM (SELECT status, group_key, COUNT(*) AS n "
                 f"FROM old_rows GROUP BY status, group_key) o WHERE g.status = o.status AND g.group_key = o.group_key;")
        added = (f"INSERT INTO {GROUP_TABLE} AS g (status, group_key, records, title, exception_type) "
                 f"SELECT status, group_key, COUNT(*), MAX(group_title), MAX(exception_type) FROM new_rows "
                 f"GROUP BY status, group_key ORDER BY status, group_key ON CONFLICT (status, group_key) DO UPDATE "
                 f"SET records = g.records + excluded.records, title = excluded.title, "
                 f"exception_type = excluded.exception_type;")

        def touched(source: str) -> str:
            return (f"UPDATE {GROUP_TABLE} g SET {_first_and_last('g')} FROM (SELECT DISTINCT status, group_key "
                    f"FROM {source}) t WHERE g.status = t.status AND g.group_key = t.group_key;")

        function = (
            f"CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $body$ BEGIN "
            f"IF TG_OP = 'INSERT' THEN {added} {touched('new_rows')} "
            f"ELSIF TG_OP = 'DELETE' THEN {taken} {touched('old_rows')} "
            f"ELSE {taken} {added} {touched('old_rows')} {touched('new_rows')} "
            f"END IF; RETURN NULL; END $body$")
        # Transition tables allow one event per trigger (and no column list).
        return [function] + [
            f"CREATE TRIGGER {TRIGGER}_{event.lower()} AFTER {event} ON {FAILED_TABLE} "
            f"REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION {TRIGGER}()"
            for event, tables in (("INSERT", "NEW TABLE AS new_rows"), ("DELETE", "OLD TABLE AS old_rows"),
                                  ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"))]

    def drop_failed_group_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{event} ON {FAILED_TABLE}" for event in ("insert", "delete", "update")
                ] + [f"DROP FUNCTION IF EXISTS {TRIGGER}()"]


class SQLiteFailedGroupsSQL(FailedGroupsSQL):
    """Row-level triggers (SQLite has no other kind); one writer at a time, so no locking."""

    def failed_group_triggers(self) -> list[str]:
        def take(row: str) -> str:
            return (f"UPDATE {GROUP_TABLE} SET records = records - 1 "
                    f"WHERE status = {row}.status AND group_key = {row}.group_key;")

        def add(row: str) -> str:
            return (f"INSERT INTO {GROUP_TABLE} (status, group_key, records, title, exception_type) "
                    f"VALUES ({row}.status, {row}.group_key, 1, {row}.group_title, {row}.exception_type) "
                    f"ON CONFLICT (status, group_key) DO UPDATE SET records = records + 1, title = excluded.title, "
                    f"exception_type = excluded.exception_type;")

        def touched(row: str) -> str:
            # No alias: a trigger's UPDATE takes none.
            return (f"UPDATE {GROUP_TABLE} SET {_first_and_last(GROUP_TABLE)} "
                    f"WHERE status = {row}.status AND group_key = {row}.group_key;")

        return [
            f"CREATE TRIGGER {TRIGGER}_insert AFTER INSERT ON {FAILED_TABLE} BEGIN {add('NEW')} {touched('NEW')} END",
            f"CREATE TRIGGER {TRIGGER}_delete AFTER DELETE ON {FAILED_TABLE} BEGIN {take('OLD')} {touched('OLD')} END",
            f"CREATE TRIGGER {TRIGGER}_update AFTER UPDATE OF status, group_key, time_of_failure ON {FAILED_TABLE} "
            f"BEGIN {take('OLD')} {add('NEW')} {touched('OLD')} {touched('NEW')} END",
        ]

    def drop_failed_group_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}_{event}" for event in ("insert", "delete", "update")]


class MSSQLFailedGroupsSQL(FailedGroupsSQL):
    """One AFTER trigger for the three events, over its ``inserted`` and ``deleted`` tables;
    MERGE … HOLDLOCK so two first records of a new group do not both insert its row."""

    def failed_group_triggers(self) -> list[str]:
        return [
            f"CREATE TRIGGER {TRIGGER} ON {FAILED_TABLE} AFTER INSERT, UPDATE, DELETE AS BEGIN "
            f"SET NOCOUNT ON; "
            f"UPDATE g SET records = g.records - o.n FROM {GROUP_TABLE} g JOIN (SELECT status, group_key, "
            f"COUNT(*) AS n FROM deleted GROUP BY status, group_key) o "
            f"ON g.status = o.status AND g.group_key = o.group_key; "
            f"MERGE {GROUP_TABLE} WITH (HOLDLOCK) AS g USING (SELECT status, group_key, COUNT(*) AS n, "
            f"MAX(group_title) AS title, MAX(exception_type) AS exception_type FROM inserted "
            f"GROUP BY status, group_key) AS i ON g.status = i.status AND g.group_key = i.group_key "
            f"WHEN MATCHED THEN UPDATE SET records = g.records + i.n, title = i.title, exception_type = i.exception_type "
            f"WHEN NOT MATCHED THEN INSERT (status, group_key, records, title, exception_type) "
            f"VALUES (i.status, i.group_key, i.n, i.title, i.exception_type); "
            f"UPDATE g SET {_first_and_last('g')} FROM {GROUP_TABLE} g JOIN (SELECT status, group_key FROM deleted "
            f"UNION SELECT status, group_key FROM inserted) t ON g.status = t.status AND g.group_key = t.group_key; "
            f"END"]

    def drop_failed_group_triggers(self) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {TRIGGER}"]
