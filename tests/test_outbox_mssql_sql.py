"""The outbox SQL the SQL Server dialect emits.  No SQL Server runs here: every statement
is parsed as T-SQL (sqlglot) and checked for the locking and batching it must have."""
from __future__ import annotations

import re

import pytest
import sqlglot
from sqlglot import exp

from core.dialects.mssql import MSSQLDialect

TABLE = "sluice_outbox_sales.orders"


@pytest.fixture
def d() -> MSSQLDialect:
    return MSSQLDialect()


def parse(sql: str, params: list | None = None) -> exp.Expression:
    """Parse one statement; the placeholder count must match the parameters given."""
    if params is not None:
        assert sql.count("%s") == len(params), sql
    return sqlglot.parse_one(sql.replace("%s", "@p"), read="tsql")


def test_every_outbox_statement_is_valid_tsql(d):
    statements = [
        (d.outbox_states(TABLE, 2), ["a", "b"]),
        (d.outbox_insert(TABLE, dispatched=False), ["id", "v", "ops"]),
        (d.outbox_insert(TABLE, dispatched=True), ["id", "v", "ops"]),
        (d.outbox_insert(TABLE, dispatched=False, count=3), ["id", "v", "ops"] * 3),  # a chunk's records
        (d.outbox_store_operations(TABLE, dispatched=False), ["ops", "id"]),
        (d.outbox_claim_lease(TABLE, 3), [*d.ttl_params(30), "token", "a", "b", "c"]),
        (d.outbox_claim_lease(TABLE, 1, include_quarantined=True), [*d.ttl_params(30), "token", "a"]),
        (d.outbox_add_lease_column(TABLE), []),
        d.outbox_lease_column_exists(TABLE),
        (d.outbox_add_column(TABLE, "DispatchToken"), []),
        d.outbox_column_exists(TABLE, "DispatchToken"),
        (d.outbox_mark_dispatched(TABLE, 2), ["ops", "a", "b", "token"]),
        (d.outbox_fail(TABLE, quarantine=True), ["error", "id", "token"]),
        (d.outbox_fail(TABLE, quarantine=False), ["error", "id", "token"]),
        (d.outbox_due(TABLE), [*d.before_now_params(5), 100]),
        (d.outbox_due(TABLE, include_failed=False), [*d.before_now_params(5), 100]),
        (d.outbox_cleanup(TABLE), d.outbox_cleanup_params(7 * 86400, 4000)),
        (d.outbox_records(TABLE, undispatched_only=True), [50]),
        (d.outbox_records(TABLE, undispatched_only=False), [50]),
        (d.outbox_record(TABLE), ["id"]),
        (d.outbox_stats(TABLE), []),
        d.outbox_size(TABLE),
        d.outbox_data_size(TABLE),
    ]
    for sql, params in statements:
        assert parse(sql, params) is not None
        assert TABLE not in sql.replace(f"[{TABLE}]", "")  # the table name is only ever quoted


def test_a_chunks_records_fit_one_statement_of_sql_server(d):
    """A chunk's records go in one multi-row VALUES: SQL Server takes at most 1,000 rows and
    2,100 parameters in one; OutboxStore.insert_many cuts at max_parameters // 3."""
    rows = d.max_parameters // 3
    assert rows <= 1000 and rows * 3 <= 2100
    sql = d.outbox_insert(TABLE, dispatched=False, count=rows)
    assert sql.count("%s") == rows * 3 and sql.count("GETUTCDATE()") == rows


def test_the_table_is_a_heap_with_a_nonclustered_key_and_filtered_indexes(d):
    create, dispatched_at, undispatched = d.create_outbox_table(TABLE)
    sql, params = create
    assert params == [f"[dbo].[{TABLE}]"] and sql.startswith("IF OBJECT_ID(%s, N'U') IS NULL CREATE TABLE")
    table = parse(sql, params).find(exp.Create)
    columns = {c.name: c.args["kind"].sql(dialect="tsql") for c in table.find_all(exp.ColumnDef)}
    assert columns == {"MessageId": "NVARCHAR(200)", "Dispatched": "BIT", "DispatchedAt": "DATETIME2",
                       "PersistenceVersion": "VARCHAR(23)", "Operations": "NVARCHAR(MAX)",
                       "CreatedAt": "DATETIME2", "Quarantined": "BIT", "LastError": "NVARCHAR(MAX)"}
    assert f"CONSTRAINT [PK_{TABLE}] PRIMARY KEY NONCLUSTERED ([MessageId])" in sql
    for (sql, params), name, where in ((dispatched_at, "Index_DispatchedAt", "[Dispatched] = 1"),
                                       (undispatched, "Index_Undispatched", "[Dispatched] = 0")):
        assert params == [name, f"[dbo].[{TABLE}]"]
        assert f"CREATE NONCLUSTERED INDEX [{name}]" in sql and sql.endswith(f"WHERE {where}")
        parse(sql, params)


def test_schema_creation_comes_first(d):
    statements = MSSQLDialect(schema="messaging").create_outbox_table(TABLE)
    assert statements[0] == ("IF SCHEMA_ID(%s) IS NULL EXEC('CREATE SCHEMA ' + %s)", ["messaging", "[messaging]"])
    assert "[messaging].[sluice_outbox_sales.orders]" in statements[1][0]


def test_phase_two_leases_records_with_row_locks_and_read_past(d):
    sql = d.outbox_claim_lease(TABLE, 2)
    assert sql.startswith(f"UPDATE [dbo].[{TABLE}] WITH (ROWLOCK, READPAST) SET [DispatchingUntil] = "
                          "DATEADD(millisecond, %s, DATEADD(minute, %s, GETUTCDATE())), [DispatchToken] = %s")
    assert "[MessageId] IN (%s, %s) AND [Dispatched] = 0 AND [Quarantined] = 0" in sql
    assert sql.endswith("AND ([DispatchingUntil] IS NULL OR [DispatchingUntil] <= GETUTCDATE())")
    update = parse(sql, [*d.ttl_params(30), "token", "a", "b"])
    assert isinstance(update, exp.Update)
    returned = [e.sql(dialect="tsql") for e in update.args["returning"].expressions]
    assert returned == ["inserted.[MessageId]", "inserted.[Operations]", "inserted.[CreatedAt]", "GETUTCDATE()"]
    assert "[Quarantined]" not in d.outbox_claim_lease(TABLE, 1, include_quarantined=True)


def test_tables_made_before_the_lease_get_its_column(d):
    sql, params = d.outbox_lease_column_exists(TABLE)
    assert params == [f"[dbo].[{TABLE}]", "DispatchingUntil"] and "COL_LENGTH(%s, %s) IS NOT NULL" in sql
    alter = parse(d.outbox_add_lease_column(TABLE), [])
    assert isinstance(alter, exp.Alter)
    assert alter.sql(dialect="tsql") == f"ALTER TABLE [dbo].[{TABLE}] ADD [DispatchingUntil] DATETIME2 NULL"


def test_cleanup_deletes_a_bounded_batch_and_skips_locked_rows(d):
    sql = d.outbox_cleanup(TABLE)
    assert sql.startswith("DELETE TOP (%s) FROM") and "WITH (ROWLOCK, READPAST)" in sql
    assert "[Dispatched] = 1 AND [DispatchedAt] <= DATEADD(millisecond, -%s, DATEADD(minute, -%s, GETUTCDATE()))" in sql
    # 7 days and a bit: whole minutes and milliseconds apart, so DATEADD's int never overflows.
    assert d.outbox_cleanup_params(7 * 86400 + 0.25, 4000) == [4000, 250, 10080]


def test_lists_page_with_offset_fetch_and_read_past_locked_rows(d):
    for sql in (d.outbox_due(TABLE), d.outbox_records(TABLE, True)):
        assert re.search(r"ORDER BY \[CreatedAt\]( ASC)? OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY$", sql)
        assert "WITH (READPAST)" in sql
    assert "[LastError] IS NULL" in d.outbox_due(TABLE, include_failed=False)


def test_the_mark_and_the_failure_are_compare_and_set_on_the_claims_token(d):
    """Issue 18 defect 3: a dispatcher whose lease was taken over changes nothing."""
    mark = parse(d.outbox_mark_dispatched(TABLE, 2), ["ops", "a", "b", "token"])
    assert isinstance(mark, exp.Update)
    assert [e.sql(dialect="tsql") for e in mark.args["returning"].expressions] == ["inserted.[MessageId]"]
    sql = d.outbox_mark_dispatched(TABLE, 2)
    assert sql.endswith("WHERE [MessageId] IN (%s, %s) AND [DispatchToken] = %s")
    assert "[DispatchingUntil] = NULL, [DispatchToken] = NULL" in sql
    fail = d.outbox_fail(TABLE, quarantine=False)
    assert fail.endswith("WHERE [MessageId] = %s AND [DispatchToken] = %s")
    assert parse(d.outbox_add_column(TABLE, "DispatchToken"), []).sql(dialect="tsql") == \
        f"ALTER TABLE [dbo].[{TABLE}] ADD [DispatchToken] VARCHAR(36) NULL"
