"""The SQL Server dialect, proven without a SQL Server.

No SQL Server can run here (see STACK-NOTES), so these tests check the T-SQL the
dialect emits instead of running it:

- every named statement has exactly as many ``%s`` placeholders as its call site
  in core/transport/ or core/queues.py passes parameters, in the right order;
- every statement parses as T-SQL with sqlglot once its placeholders are bound the
  way the ODBC driver sends them (``@P1``, ``@P2`` … to sp_executesql), and the
  parse tree says what the SQL transport needs (heap + nonclustered indexes,
  ``UPDLOCK, READPAST, ROWLOCK``, ``OUTPUT deleted.…``, no ``COUNT(*)`` in peek);
  where sqlglot cannot read a valid T-SQL construct the statement is checked
  structurally instead, and a comment says so;
- mssql-django itself (not connected: its version probe is pre-filled) picks the
  dialect, compiles an ORM ``select_for_update(skip_locked=True)`` on a queue
  model, and carries the transport's own statements through its cursor wrapper
  down to a stand-in for the pyodbc cursor.

Nothing here needs the ``db`` fixture.
"""
from __future__ import annotations

import copy
import datetime as dt
import json
import re
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
import sqlglot
from django.db.backends.utils import CursorWrapper as DjangoCursorWrapper
from django.db.utils import ConnectionHandler
from sqlglot import exp

from core.dialects import dialect_for
from core.dialects.rows import COLUMNS, MESSAGE_COLUMNS
from core.dialects.mssql import MSSQLDialect
from core.queues import MAX_TTL_SECONDS, QueueInfo, queue_model, registry, validate_name
from core.db import StatementCursor
from core.transport import Transport, row_id_for
from sluice.dburl import DatabaseUrlError, parse_database_url

ROOT = Path(__file__).resolve().parent.parent
NAME = "orders"
MSSQL_URL = "mssql://sa:p%40ss@db:1433/sluice?python_driver=mssql_python&TrustServerCertificate=yes"
ALIAS = "sluice_fake_mssql"
INT_MAX = 2**31 - 1  # DATEADD's number argument is an int


# -- helpers -------------------------------------------------------------------

def placeholders(sql: str) -> int:
    """Number of ``%s`` placeholders; any other ``%`` would break mssql-django, which
    formats the SQL with ``sql % ('?', …)`` when there are params and not at all
    when there are none, so a literal ``%`` can be right in neither case."""
    assert "%" not in sql.replace("%s", ""), f"stray % in {sql!r}"
    return sql.count("%s")


def bind(sql: str, n_params: int) -> str:
    """Bind placeholders as the ODBC driver does for sp_executesql: @P1, @P2, …"""
    assert placeholders(sql) == n_params, f"{placeholders(sql)} placeholders, {n_params} params: {sql}"
    counter = iter(range(1, n_params + 1))
    return re.sub(r"%s", lambda _: f"@P{next(counter)}", sql)


def parse(sql: str) -> list[exp.Expression]:
    """T-SQL parse trees; fails on a parse error or on sqlglot's opaque fallback."""
    trees = [t for t in sqlglot.parse(sql, read="tsql", error_level=sqlglot.ErrorLevel.RAISE) if t is not None]
    assert trees, sql
    for tree in trees:
        assert not list(tree.find_all(exp.Command)), f"sqlglot did not really parse: {tree.sql('tsql')}"
    return trees


def parse_one(sql: str) -> exp.Expression:
    trees = parse(sql)
    assert len(trees) == 1, [t.sql("tsql") for t in trees]
    return trees[0]


def param_name(node: exp.Expression) -> str:
    assert isinstance(node, exp.Parameter), repr(node)
    return node.name


def hints(table: exp.Table) -> list[str]:
    (hint,) = table.args["hints"]
    assert isinstance(hint, exp.WithTableHint)
    return [h.name.upper() for h in hint.expressions]


def assert_table(table: exp.Table, name: str, schema: str = "dbo") -> None:
    """The identifiers sqlglot read back are exactly the queue's name and schema."""
    assert isinstance(table, exp.Table)
    assert (table.name, table.db) == (name, schema)
    assert table.this.quoted and table.args["db"].quoted


def assert_column(node: exp.Expression, name: str, table: str | None = None) -> None:
    assert isinstance(node, exp.Column), repr(node)
    assert node.name == name and node.this.quoted, repr(node)
    assert (node.table or None) == table, repr(node)


def assert_expired_flag(case: exp.Expression, prefix: str | None) -> None:
    """CASE WHEN <Expires> IS NOT NULL AND <Expires> <= GETUTCDATE() THEN 1 ELSE 0 END."""
    assert isinstance(case, exp.Case)
    (when,) = case.args["ifs"]
    cond = when.this
    assert isinstance(cond, exp.And)
    not_null, due = cond.this, cond.expression
    assert isinstance(not_null, exp.Not) and isinstance(not_null.this, exp.Is)
    assert_column(not_null.this.this, "Expires", prefix)
    assert isinstance(not_null.this.expression, exp.Null)
    assert isinstance(due, exp.LTE)
    assert_column(due.this, "Expires", prefix)
    assert due.expression.name.upper() == "GETUTCDATE"
    assert when.args["true"].this == "1" and case.args["default"].this == "0"


def is_getutcdate(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.upper() == "GETUTCDATE"


# -- 1. every named statement: placeholders vs call sites, and it parses ----------

class Stmt(NamedTuple):
    what: str
    sql: str
    n_params: int               # how many params the call site passes
    params: list | None         # the params the dialect returns with the SQL, if it does


def _statements(d: MSSQLDialect, name: str) -> list[Stmt]:
    """Every named statement with the number of params its call site passes.

    queues.py executes create/drop/existing_indexes/ddl_lock (and tests
    table_exists) with the params the dialect returns next to the SQL;
    core/transport/ builds the lists noted below.
    """
    out = []
    for i, (sql, params) in enumerate(d.create_queue_table(name)):
        out.append(Stmt(f"create_queue_table[{i}]", sql, len(params), params))
    lock_sql, lock_params = d.ddl_lock()
    out.append(Stmt("ddl_lock", lock_sql, len(lock_params), lock_params))
    for i, (sql, params) in enumerate(d.drop_queue_table(name)):
        out.append(Stmt(f"drop_queue_table[{i}]", sql, len(params), params))
    for what in ("existing_indexes", "table_exists"):
        sql, params = getattr(d, what)(name)
        out.append(Stmt(what, sql, len(params), params))
    # transport.insert / send_many: [row_id, correlation_id, reply_to, *ttl_params, headers, body]
    out.append(Stmt("insert_with_ttl", d.insert_with_ttl(name), 3 + len(d.ttl_params(60)) + 2, None))
    # transport.insert / send_many / requeue: [row_id, correlation_id, reply_to, expires, headers, body]
    out.append(Stmt("insert_with_expires", d.insert_with_expires(name), 6, None))
    # transport.enqueue, several rows in one statement (each row's params as above)
    for with_ttl in (True, False):
        per_row = 5 + len(d.ttl_params(60)) if with_ttl else 6
        sql, params = d.insert_rows(name, [[None] * per_row] * 3, with_ttl)
        out.append(Stmt("insert_rows", sql, len(params), None))
    # core/tasks: a task's message and its result row in one batch (the insert's params, then the row's)
    sql, params = d.insert_rows(name, [[None] * (5 + len(d.ttl_params(60)))], True)
    out.append(Stmt("insert_along", d.insert_along(sql, d.insert_returning("sluice_task_result", ["id"], "enqueued_at")),
                    len(params) + 1, None))
    out.append(Stmt("receive", d.receive(name), 1, None))                     # [limit]
    out.append(Stmt("receive_from", d.receive_from(name), len(d.receive_from_params(1, 8)), None))
    out.append(Stmt("peek_estimate", d.peek_estimate(name), 0, None))         # []
    out.append(Stmt("peek_range", d.peek_range(name), 0, None))               # []
    out.append(Stmt("peek_range", d.peek_range(name, from_mark=True), 2, None))  # [mark, mark]
    out.append(Stmt("browse", d.browse(name), len(d.browse_params(0, 50)), None))
    out.append(Stmt("counts", d.counts(name), 0, None))                       # []
    out.append(Stmt("delete_by_id", d.delete_by_id(name), 1, None))           # [row_id]
    out.append(Stmt("purge_expired", d.purge_expired(name), 1, None))         # [batch size]
    out.append(Stmt("purge_all", d.purge_all(name), 1, None))                 # [batch size]
    # core/delayed.py's SqlDelayedStore, on a store table of the same name.
    for i, (sql, params) in enumerate(d.create_delayed_table(name)):
        out.append(Stmt(f"create_delayed_table[{i}]", sql, len(params), params))
    out.append(Stmt("delayed_insert_at", d.delayed_insert_at(name),
                    len(d.delayed_insert_params("id", "dest", b"", [None], "{}")), None))
    out.append(Stmt("delayed_insert_after", d.delayed_insert_after(name),
                    len(d.delayed_insert_params("id", "dest", b"", d.ttl_params(5), "{}")), None))
    for after in (True, False):  # SqlDelayedStore.store_many, 3 rows
        when = d.ttl_params(5) if after else [None]
        out.append(Stmt("delayed_insert_many", d.delayed_insert_many(name, 3, after),
                        len(d.delayed_insert_many_params([("id", "dest", b"", when, "{}")] * 3)), None))
    out.append(Stmt("delayed_fetch_due", d.delayed_fetch_due(name), len(d.delayed_fetch_params(None, 10)), None))
    out.append(Stmt("delayed_claim_due", d.delayed_claim_due(name), len(d.delayed_claim_params(None, 10)), None))
    for what in ("delayed_remove", "delayed_increment_failure", "delayed_list", "delayed_deliver_now"):
        out.append(Stmt(what, getattr(d, what)(name), 1, None))                # [id] or [limit]
    out.append(Stmt("delayed_next", d.delayed_next(name), 0, None))
    out.append(Stmt("delayed_has_destination", d.delayed_has_destination(name), 1, None))  # [queue]
    out.append(Stmt("delayed_remove_many", d.delayed_remove_many(name, 3), 3, None))        # the ids
    out.append(Stmt("receive_expired", d.receive_expired(name), 1, None))                  # [limit]
    out.append(Stmt("max_row_version", d.max_row_version(name), 0, None))
    out.append(Stmt("lock_table", d.lock_table(name), 0, None))
    # core/records/horizon.py: the records export's horizon (on the records table; one statement).
    out.append(Stmt("record_horizon", d.record_horizon(d.table(name)), 0, None))
    # SqlDelayedStore.setup_infrastructure: the old default store name to the new one.
    for i, (sql, params) in enumerate(d.rename_delayed_table(name, name + "_new")):
        out.append(Stmt(f"rename_delayed_table[{i}]", sql, len(params), params))
    return out


NAMED = ["create_queue_table", "ddl_lock", "drop_queue_table", "existing_indexes", "table_exists",
         "insert_with_ttl", "insert_with_expires", "receive", "peek_estimate", "browse", "counts",
         "delete_by_id", "purge_expired", "purge_all",
         "create_delayed_table", "delayed_insert_at", "delayed_insert_after", "delayed_fetch_due",
         "delayed_remove", "delayed_increment_failure", "delayed_list", "delayed_deliver_now", "delayed_next",
         "delayed_has_destination", "receive_expired", "max_row_version", "lock_table", "delayed_remove_many",
         "rename_delayed_table", "insert_rows", "delayed_insert_many", "delayed_claim_due", "record_horizon",
         "insert_along", "receive_from", "peek_range"]


def not_parseable(stmt: Stmt) -> bool:
    """Statements sqlglot (30.x) cannot read although they are valid T-SQL; each is
    checked structurally by its own test below instead:

    - ddl_lock: sqlglot has no THROW statement (and its BEGIN … END swallows the
      next statement);
    - the CREATE SCHEMA step: ``IF … EXEC('CREATE SCHEMA ' + @P2)`` — sqlglot takes
      ``EXEC`` for an alias and the parenthesis for an expression, not dynamic SQL;
    """
    return (stmt.what in ("ddl_lock",) or stmt.sql.startswith("IF SCHEMA_ID("))


def test_every_named_statement_is_covered():
    covered = {stmt.what.split("[")[0] for stmt in _statements(MSSQLDialect(), NAME)}
    assert covered == set(NAMED)
    # Every public statement-making method of the dialect is in the list (a new one must be added).
    from core.dialects.base import Dialect
    from core.dialects.delayed_sql import DelayedSQL
    from core.dialects.removal_sql import RemovalSQL

    helpers = {"quote", "table", "index_names", "delayed_time_index", "create_schema", "to_row", "to_datetime", "datetime_param",
               "ttl_params", "browse_params", "receive_from_params", "now_sql", "edge", "delete_locked", "expires_after_ttl_sql", "expired_sql",
               "delayed_insert_params", "delayed_insert_many_params", "insert_rows_per_statement", "delayed_fetch_params", "delayed_claim_params", "notify", "error_codes", "is_transient", "is_missing_table",
               "transaction_aborted",  # reads the driver's state: no SQL
                   # PostgreSQL only (capability flags): no SQL Server statement to check.
                   "server_cursor", "table_upkeep", "table_upkeep_active", "copy_in", "copy_rows", "horizon_settled",
               "reclaim_dead_rows", "delayed_claim_due_and_next"}
    public = {n for cls in (Dialect, RemovalSQL, DelayedSQL) for n, v in vars(cls).items()
              if callable(v) and not n.startswith("_")} - helpers
    # The outbox's statements are checked by tests/test_outbox_mssql_sql.py, the dashboard's
    # by tests/test_dashboard_sql.py.
    from tests.test_dashboard_sql import DASHBOARD_STATEMENTS

    public = {n for n in public if "outbox" not in n and not n.startswith("before_now")} - DASHBOARD_STATEMENTS
    assert public == set(NAMED)


def test_sql_server_inserts_every_batch_with_insert_rows():
    """SQL Server has no COPY (supports_copy_in): copy_rows sends every batch to insert_rows."""
    d = MSSQLDialect()
    assert not d.supports_copy_in and d.copy_rows(NAME, 10_000, False) is None


@pytest.mark.parametrize("schema", [None, "sales"])
@pytest.mark.parametrize("name", [NAME, "Billing.Events-v2"])
def test_placeholders_match_params_and_sql_parses_as_tsql(schema, name):
    d = MSSQLDialect(schema=schema)
    for stmt in _statements(d, name):
        bound = bind(stmt.sql, stmt.n_params)             # asserts the count (and no stray %)
        assert "GROUP BY" not in stmt.sql, stmt.what      # mssql-django rewrites GROUP BY statements
        if not_parseable(stmt):
            continue
        trees = parse(bound)
        tables = [t for tree in trees for t in tree.find_all(exp.Table)
                  if t.name not in ("indexes", "message", "sp_rename", "sluice_task_result")]  # sys.indexes,
            # receive's CTE, Django's table of task results (insert_along)
        for table in tables:                              # the queue table, schema-qualified
            assert_table(table, name, schema or "dbo")
        if not tables:                                    # it names the table in a param (OBJECT_ID)
            assert stmt.params[0] == d.table(name), stmt.what


# -- identifiers ------------------------------------------------------------------

def test_identifiers_are_bracket_quoted_and_a_closing_bracket_is_doubled():
    d = MSSQLDialect()
    assert d.quote("orders") == "[orders]"
    assert d.quote("a]b") == "[a]]b]"
    assert d.quote("[x]") == "[[x]]]"
    assert d.table("orders") == "[dbo].[orders]"
    assert d.table("a]b") == "[dbo].[a]]b]"
    assert MSSQLDialect(schema="sa]les").table("or]ders") == "[sa]]les].[or]]ders]"
    # A dotted queue name stays one identifier, not schema.table.
    assert d.table("Billing.Events") == "[dbo].[Billing.Events]"


def _mentions(stmt: Stmt, text: str) -> bool:
    return text in stmt.sql or any(isinstance(p, str) and text in p for p in stmt.params or ())


def test_a_bracket_in_a_name_is_escaped_in_every_statement():
    d = MSSQLDialect(schema="sa]les")
    for stmt in _statements(d, "or]ders"):
        if stmt.what == "ddl_lock" or stmt.sql.startswith("IF SCHEMA_ID("):
            continue
        assert _mentions(stmt, "[sa]]les].[or]]ders]"), stmt.what
        assert "[or]ders]" not in stmt.sql and "[sa]les]" not in stmt.sql, stmt.what
    # sqlglot reads the doubled bracket back as the raw name.
    _, delete = parse(bind(d.receive("or]ders"), 1))
    assert_table(delete.find(exp.CTE).this.args["from_"].this, "or]ders", "sa]les")


def test_schema_defaults_to_dbo_and_a_configured_schema_is_used_everywhere():
    for schema, table in [(None, "[dbo].[orders]"), ("sales", "[sales].[orders]")]:
        d = MSSQLDialect(schema=schema)
        assert d.schema == schema and d.table(NAME) == table
        for stmt in _statements(d, NAME):
            if stmt.what == "ddl_lock" or stmt.sql.startswith("IF SCHEMA_ID("):
                continue
            assert _mentions(stmt, table), stmt.what
            assert "[dbo]" not in stmt.sql or schema is None, stmt.what


# -- 2. what the SPEC asks of SQL Server -------------------------------------------

def test_create_table_is_a_heap_with_the_transport_columns():
    d = MSSQLDialect()
    stmts = d.create_queue_table(NAME)
    assert len(stmts) == 3  # table, RowVersion index, Expires index (no schema step for dbo)
    sql, params = stmts[0]
    assert params == ["[dbo].[orders]"]
    tree = parse_one(bind(sql, 1))
    assert isinstance(tree, exp.IfBlock)
    cond = tree.this                                   # IF OBJECT_ID(@P1, N'U') IS NULL
    assert isinstance(cond, exp.Is) and isinstance(cond.expression, exp.Null)
    assert isinstance(cond.this, exp.ObjectId) and param_name(cond.this.this) == "P1"
    (create,) = tree.args["true"].expressions
    assert isinstance(create, exp.Create) and create.kind == "TABLE"
    assert_table(create.this.this, NAME)
    cols = {c.name: c for c in create.this.expressions if isinstance(c, exp.ColumnDef)}
    assert list(cols) == list(COLUMNS)
    assert len(create.this.expressions) == len(COLUMNS)  # no table constraints at all

    def nullable(col):
        (nn,) = [c.kind for c in col.constraints if isinstance(c.kind, exp.NotNullColumnConstraint)]
        return bool(nn.args.get("allow_null"))

    expected = {
        "Id": ("UNIQUEIDENTIFIER", False), "CorrelationId": ("VARCHAR(255)", True),
        "ReplyToAddress": ("VARCHAR(255)", True), "Recoverable": ("BIT", False),
        "Expires": ("DATETIME", True), "Headers": ("NVARCHAR(MAX)", False),
        "Body": ("VARBINARY(MAX)", True), "RowVersion": ("BIGINT", False),
    }
    for col, (typ, null) in expected.items():
        assert cols[col].kind.sql("tsql").upper() == typ, col
        assert nullable(cols[col]) is null, col
    (identity,) = [c.kind for c in cols["RowVersion"].constraints
                   if isinstance(c.kind, exp.GeneratedAsIdentityColumnConstraint)]
    assert (identity.args["start"].this, identity.args["increment"].this) == ("1", "1")
    # A heap: no primary key and nothing clustered (a clustered RowVersion index
    # caused last-page latch contention).
    for sql, _ in stmts:
        assert "PRIMARY KEY" not in sql.upper()
        assert not re.search(r"(?<!NON)CLUSTERED", sql.upper()), sql
    assert not list(create.find_all(exp.PrimaryKey, exp.PrimaryKeyColumnConstraint))


def _index(sql: str, params: list) -> tuple[exp.Create, exp.IfBlock]:
    tree = parse_one(bind(sql, len(params)))
    assert isinstance(tree, exp.IfBlock)
    # IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = @P1 AND object_id = OBJECT_ID(@P2))
    exists = tree.this
    assert isinstance(exists, exp.Not) and isinstance(exists.this, exp.Exists)
    where = exists.this.this.args["where"].this
    assert where.this.this.name == "name" and param_name(where.this.expression) == "P1"
    assert where.expression.this.name == "object_id"
    assert param_name(where.expression.expression.this) == "P2"
    (create,) = tree.args["true"].expressions
    return create, tree


def test_rowversion_index_is_nonclustered_and_named_like_the_transport():
    d = MSSQLDialect()
    sql, params = d.create_queue_table(NAME)[1]
    assert params == ["Index_RowVersion", "[dbo].[orders]"]
    assert "CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [dbo].[orders] ([RowVersion] ASC)" in sql
    create, _ = _index(sql, params)
    assert create.kind.upper() == "NONCLUSTERED INDEX"
    index = create.this
    assert index.name == "Index_RowVersion"
    assert_table(index.args["table"], NAME)
    cols = index.args["params"].args["columns"]
    assert [c.this.name for c in cols] == ["RowVersion"] and not cols[0].args.get("desc")
    assert not index.args["params"].args.get("where")
    assert d.index_names(NAME) == {"rowversion": "Index_RowVersion", "expires": "Index_Expires"}


def test_expires_index_is_filtered_nonclustered_and_includes_id_and_rowversion():
    d = MSSQLDialect()
    sql, params = d.create_queue_table(NAME)[2]
    assert params == ["Index_Expires", "[dbo].[orders]"]
    assert sql.endswith("INCLUDE ([Id], [RowVersion]) WHERE [Expires] IS NOT NULL")
    create, _ = _index(sql, params)
    assert create.kind.upper() == "NONCLUSTERED INDEX"
    index = create.this
    assert index.name == "Index_Expires"
    assert_table(index.args["table"], NAME)
    p = index.args["params"]
    assert [c.this.name for c in p.args["columns"]] == ["Expires"]
    assert [i.name for i in p.args["include"]] == ["Id", "RowVersion"]
    where = p.args["where"].this
    assert isinstance(where, exp.Not) and isinstance(where.this, exp.Is)
    assert_column(where.this.this, "Expires")


def test_create_schema_step_runs_first_and_quotes_the_schema():
    # sqlglot cannot read EXEC('…' + @P2) (dynamic SQL) — checked structurally.
    d = MSSQLDialect(schema="sa]les")
    stmts = d.create_queue_table(NAME)
    assert len(stmts) == 4
    sql, params = stmts[0]
    assert sql == "IF SCHEMA_ID(%s) IS NULL EXEC('CREATE SCHEMA ' + %s)"
    # SCHEMA_ID takes the raw name; the dynamic CREATE SCHEMA gets it bracket-quoted.
    assert params == ["sa]les", "[sa]]les]"]
    assert stmts[1][1] == ["[sa]]les].[orders]"]
    assert "CREATE TABLE [sa]]les].[orders] (" in stmts[1][0]


def test_ddl_lock_is_a_transaction_owned_exclusive_applock():
    # sqlglot has no THROW statement, and its BEGIN … END block swallows the
    # statement after END: the batch is checked structurally and each of its
    # other statements is parsed on its own.
    sql, params = MSSQLDialect().ddl_lock()
    assert params == [] and placeholders(sql) == 0
    guard = "IF @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 2 BEGIN BEGIN TRANSACTION; COMMIT TRANSACTION; END;"
    lock = ("EXEC @r = sp_getapplock @Resource = N'sluice:ddl', @LockMode = 'Exclusive', "
            "@LockOwner = 'Transaction', @LockTimeout = 60000;")
    throw = "IF @r < 0 THROW 51000, 'Sluice: could not take the DDL lock', 1;"
    assert sql.startswith("DECLARE @r int; ")
    assert sql.index(guard) < sql.index(lock) < sql.index(throw)
    assert sql.endswith(throw)
    declare = parse_one("DECLARE @r int;")
    assert isinstance(declare, exp.Declare)
    guard_tree = parse_one(guard)
    execute = parse_one(lock)
    # The guard opens the implicit transaction a manual-commit ODBC connection has
    # not opened yet (DECLARE/EXEC do not), so a Transaction-owned lock can be taken.
    assert isinstance(guard_tree, exp.IfBlock)
    body = [type(e) for e in guard_tree.args["true"].expressions]
    assert body[:2] == [exp.Transaction, exp.Commit]
    assert isinstance(execute, exp.Execute) and execute.this.name == "sp_getapplock"
    args = {a.this.name: a.expression.this for a in execute.expressions}
    assert args == {"Resource": "sluice:ddl", "LockMode": "Exclusive", "LockOwner": "Transaction",
                    "LockTimeout": "60000"}


def test_drop_existing_indexes_and_table_exists():
    d = MSSQLDialect()
    ((sql, params),) = d.drop_queue_table(NAME)
    assert params == ["[dbo].[orders]"]
    tree = parse_one(bind(sql, 1))
    assert isinstance(tree, exp.IfBlock) and isinstance(tree.this, exp.Not)   # OBJECT_ID(…) IS NOT NULL
    assert isinstance(tree.this.this.this, exp.ObjectId)
    (drop,) = tree.args["true"].expressions
    assert isinstance(drop, exp.Drop) and drop.kind == "TABLE"
    (dropped,) = drop.args["tables"]
    assert_table(dropped, NAME)

    sql, params = d.existing_indexes(NAME)
    assert params == ["[dbo].[orders]"]
    tree = parse_one(bind(sql, 1))
    assert [e.name for e in tree.expressions] == ["name"]
    assert tree.args["from_"].this.sql("tsql") == "sys.indexes"
    assert "name IS NOT NULL" in sql  # a heap has an unnamed row in sys.indexes

    sql, params = d.table_exists(NAME)
    assert params == ["[dbo].[orders]"]
    tree = parse_one(bind(sql, 1))
    assert isinstance(tree, exp.Select) and "OBJECT_ID(%s, N'U') IS NOT NULL" in sql


def test_receive_deletes_top_n_in_rowversion_order_skipping_locked_rows():
    d = MSSQLDialect()
    sql = d.receive(NAME)
    assert placeholders(sql) == 1  # transport.receive_batch passes [limit]
    assert "TOP (%s)" in sql
    assert "[dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK)" in sql
    assert "ORDER BY [RowVersion]" in sql
    # A CTE must follow a terminated statement.
    assert sql.startswith("SET NOCOUNT ON; WITH message AS (")
    set_nocount, delete = parse(bind(sql, 1))
    assert isinstance(set_nocount, exp.Set)
    assert isinstance(delete, exp.Delete)
    assert delete.this.name == "message"                               # DELETE FROM the CTE
    cte = delete.args["with_"].expressions[0]
    assert cte.alias == "message"
    select = cte.this
    assert isinstance(select.expressions[0], exp.Star)
    assert param_name(select.args["limit"].expression) == "P1"          # TOP (@P1)
    table = select.args["from_"].this
    assert_table(table, NAME)
    assert hints(table) == ["UPDLOCK", "READPAST", "ROWLOCK"]
    (order,) = select.args["order"].expressions
    assert_column(order.this, "RowVersion")
    assert not order.args.get("desc")
    out = delete.args["returning"].expressions                          # OUTPUT deleted.…
    assert len(out) == len(MESSAGE_COLUMNS) + 1
    for node, column in zip(out, MESSAGE_COLUMNS):
        assert_column(node, column, "deleted")
    assert [c for c in MESSAGE_COLUMNS] == ["Id", "CorrelationId", "ReplyToAddress", "Expires", "Headers",
                                            "Body", "RowVersion"]
    assert_expired_flag(out[-1], "deleted")


def test_receive_from_a_mark_is_the_receive_with_a_rowversion_floor():
    """core.runtime.marks: the receive's TOP (n) CTE, from RowVersion @P2 on (TOP's
    parameter comes first, so receive_from_params puts the limit first)."""
    d = MSSQLDialect()
    assert d.supports_receive_mark
    sql = d.receive_from(NAME)
    assert d.receive_from_params(1000, 8) == [8, 1000]
    assert sql == d.receive(NAME).replace("ORDER BY", "WHERE [RowVersion] >= %s ORDER BY")
    _, delete = parse(bind(sql, 2))
    select = delete.args["with_"].expressions[0].this
    assert param_name(select.args["limit"].expression) == "P1"          # TOP (@P1)
    floor = select.args["where"].this
    assert isinstance(floor, exp.GTE)
    assert_column(floor.this, "RowVersion")
    assert param_name(floor.expression) == "P2"
    assert hints(select.args["from_"].this) == ["UPDLOCK", "READPAST", "ROWLOCK"]


def test_receive_orm_hints_match_what_mssql_django_emits(mssql_connection):
    # The same lock hints as the ORM's select_for_update(skip_locked=True).
    model = queue_model(NAME)
    qs = model.objects.select_for_update(skip_locked=True).order_by("row_version")[:1]
    sql, _ = qs.query.get_compiler(connection=mssql_connection).as_sql()
    orm_hints = set(re.search(r"WITH \(([^)]*)\)", sql).group(1).split(", "))
    receive_hints = set(re.search(r"WITH \(([^)]*)\)", MSSQLDialect().receive(NAME)).group(1).split(", "))
    assert orm_hints == receive_hints == {"UPDLOCK", "READPAST", "ROWLOCK"}


def test_peek_estimates_from_rowversion_and_never_counts():
    d = MSSQLDialect()
    sql = d.peek_estimate(NAME)
    assert placeholders(sql) == 0
    assert "COUNT" not in sql.upper()
    tree = parse_one(sql)
    assert not list(tree.find_all(exp.Count))
    maxes, mins = list(tree.find_all(exp.Max)), list(tree.find_all(exp.Min))
    assert len(maxes) == len(mins) == 1
    assert_column(maxes[0].this, "RowVersion")
    assert_column(mins[0].this, "RowVersion")
    for table in tree.find_all(exp.Table):
        assert_table(table, NAME)
        assert hints(table) == ["NOLOCK"]        # an estimate need not wait for receivers
    assert "COALESCE(" in sql and sql.endswith("+ 1, 0)")  # empty queue → 0
    assert sql.count("WITH (NOLOCK)") == 2  # an estimate does not wait for receivers


def test_browse_pages_oldest_first_without_taking():
    d = MSSQLDialect()
    sql = d.browse(NAME)
    params = d.browse_params(after_row_version=41, limit=50)
    assert params == [41, 50]                     # the limit last: OFFSET 0 ROWS FETCH NEXT @P2
    tree = parse_one(bind(sql, len(params)))
    assert param_name(tree.args["limit"].args["count"]) == "P2"
    assert tree.args["offset"].expression.this == "0"
    where = tree.args["where"].this
    assert isinstance(where, exp.GT) and param_name(where.expression) == "P1"
    assert_column(where.this, "RowVersion")
    for node, column in zip(tree.expressions, MESSAGE_COLUMNS):
        assert_column(node, column)
    assert len(tree.expressions) == len(MESSAGE_COLUMNS) + 1
    assert_expired_flag(tree.expressions[-1], None)
    table = tree.args["from_"].this
    assert hints(table) == ["READPAST"]
    (order,) = tree.args["order"].expressions
    assert_column(order.this, "RowVersion")
    assert not order.args.get("desc")


def test_counts_total_and_expired():
    sql = MSSQLDialect().counts(NAME)
    tree = parse_one(sql)
    assert len(tree.expressions) == 2 and len(list(tree.find_all(exp.Count))) == 2
    assert "[Expires] <= GETUTCDATE()" in sql


def test_insert_with_expires_binds_columns_in_call_site_order():
    sql = MSSQLDialect().insert_with_expires(NAME)
    tree = parse_one(bind(sql, 6))
    cols = [c.name for c in tree.this.expressions]
    assert cols == list(COLUMNS[:-1])             # RowVersion is the identity
    (row,) = tree.expression.expressions
    values = dict(zip(cols, row.expressions))
    assert {c: param_name(v) for c, v in values.items() if c != "Recoverable"} == {
        "Id": "P1", "CorrelationId": "P2", "ReplyToAddress": "P3", "Expires": "P4", "Headers": "P5", "Body": "P6"}
    assert values["Recoverable"].this == "1"      # always true, for transport v1 compatibility


def test_insert_with_ttl_computes_expires_from_the_database_clock():
    d = MSSQLDialect()
    sql = d.insert_with_ttl(NAME)
    n = 3 + len(d.ttl_params(60)) + 2
    assert n == 7
    tree = parse_one(bind(sql, n))
    (row,) = tree.expression.expressions
    values = dict(zip([c.name for c in tree.this.expressions], row.expressions))
    assert [param_name(values[c]) for c in ("Id", "CorrelationId", "ReplyToAddress", "Headers", "Body")] == \
        ["P1", "P2", "P3", "P6", "P7"]
    # Expires = DATEADD(millisecond, @P4, DATEADD(minute, @P5, GETUTCDATE())):
    # ttl_params order is [milliseconds, minutes].
    outer = values["Expires"]
    assert isinstance(outer, exp.DateAdd) and outer.unit.name.upper() == "MILLISECOND"
    assert param_name(outer.expression) == "P4"
    inner = outer.this
    assert isinstance(inner, exp.DateAdd) and inner.unit.name.upper() == "MINUTE"
    assert param_name(inner.expression) == "P5"
    assert is_getutcdate(inner.this)


def test_delete_by_id_skips_a_message_a_receiver_holds():
    sql = MSSQLDialect().delete_by_id(NAME)
    tree = parse_one(bind(sql, 1))
    assert isinstance(tree, exp.Delete)
    assert_table(tree.this, NAME)
    assert hints(tree.this) == ["ROWLOCK", "READPAST"]
    where = tree.args["where"].this
    assert isinstance(where, exp.EQ) and param_name(where.expression) == "P1"
    assert_column(where.this, "Id")


@pytest.mark.parametrize("which", ["purge_expired", "purge_all"])
def test_purge_deletes_a_batch_row_locked_in_the_receives_order(which):
    """Defect 4: READPAST alone let SQL Server take page locks.  The purge takes rows as
    the receive does — UPDLOCK, READPAST, ROWLOCK through a TOP (n) CTE in RowVersion
    order — so it never escalates past row locks (batches ≤ 4,000) and never locks in an
    order opposite to a receive's."""
    d = MSSQLDialect()
    sql = getattr(d, which)(NAME)
    assert placeholders(sql) == 1                 # transport.purge passes [batch size]
    assert "SET NOCOUNT" not in sql               # transport.purge reads the rowcount
    (delete,) = parse(bind(sql, 1))
    assert isinstance(delete, exp.Delete) and delete.this.name == "message"
    cte = delete.args["with_"].expressions[0]
    select = cte.this
    assert param_name(select.args["limit"].expression) == "P1"          # TOP (@P1)
    table = select.args["from_"].this
    assert_table(table, NAME)
    assert hints(table) == ["UPDLOCK", "READPAST", "ROWLOCK"]
    (order,) = select.args["order"].expressions
    assert_column(order.this, "RowVersion")                             # the receive's order
    receive_order = parse(bind(d.receive(NAME), 1))[1].args["with_"].expressions[0].this.args["order"]
    assert order.this == receive_order.expressions[0].this
    where = select.args.get("where")
    if which == "purge_all":
        assert where is None
        return
    cond = where.this                             # [Expires] IS NOT NULL AND [Expires] <= GETUTCDATE()
    assert isinstance(cond, exp.And)
    assert isinstance(cond.this, exp.Not) and isinstance(cond.this.this, exp.Is)
    assert_column(cond.this.this.this, "Expires")
    assert isinstance(cond.expression, exp.LTE) and is_getutcdate(cond.expression.expression)
    assert_column(cond.expression.this, "Expires")


def test_lock_table_reads_a_row_so_the_table_lock_is_taken():
    """Defect 2: ``TOP 0`` may be answered without opening the table (no lock at all)."""
    tree = parse_one(MSSQLDialect().lock_table(NAME))
    assert isinstance(tree, exp.Select)
    assert tree.args["limit"].expression.name == "1"                    # TOP (1), not TOP 0
    table = tree.args["from_"].this
    assert_table(table, NAME)
    assert hints(table) == ["TABLOCKX", "HOLDLOCK"]


def test_counts_say_they_are_not_exact_on_sql_server():
    """Defect 11: counts() reads WITH (NOLOCK), so the dialect says they are not exact."""
    from core.dialects.postgresql import PostgreSQLDialect
    from core.dialects.sqlite import SQLiteDialect

    assert "NOLOCK" in MSSQLDialect().counts(NAME) and MSSQLDialect.counts_are_exact is False
    assert PostgreSQLDialect.counts_are_exact and SQLiteDialect.counts_are_exact


def test_remove_many_statements_fit_sql_servers_parameter_limit():
    """Defect 11: at most 2,100 parameters per statement on SQL Server."""
    d = MSSQLDialect()
    assert d.max_parameters <= 2100
    sql = d.delayed_remove_many(NAME, d.max_parameters)
    assert placeholders(sql) == d.max_parameters
    tree = parse_one(bind(sql, d.max_parameters))
    assert isinstance(tree, exp.Delete) and len(tree.args["where"].this.expressions) == d.max_parameters


@pytest.mark.parametrize("args, transient", [
    (("40001", "[40001] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction (Process ID 61) was "
               "deadlocked on lock resources with another process and has been chosen as the deadlock victim. "
               "Rerun the transaction. (1205) (SQLExecDirectW)"), True),
    (("HY000", "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Lock request time out period "
               "exceeded. (1222) (SQLExecDirectW)"), True),
    (("23000", "[23000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of PRIMARY KEY "
               "constraint 'PK_x'. Cannot insert duplicate key in object 'dbo.x'. (2627) (SQLExecDirectW)"), False),
    (("42S02", "[42S02] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Invalid object name "
               "'dbo.nope'. (208) (SQLExecDirectW)"), False),
])
def test_transient_errors_are_read_from_the_driver_error(args, transient):
    """Defect 5: SQL Server's deadlock victim and lock time-out are the database's fault,
    a constraint violation or a missing table the statement's; Django wraps the driver
    error, so the cause is read too."""
    from django.db import DatabaseError

    driver_error = Exception(*args)
    wrapped = DatabaseError(*args)
    wrapped.__cause__ = driver_error
    assert MSSQLDialect().is_transient(driver_error) is transient
    assert MSSQLDialect().is_transient(wrapped) is transient
    assert MSSQLDialect().is_missing_table(wrapped) is ("(208)" in args[1])


# -- TTL and datetimes ---------------------------------------------------------------

@pytest.mark.parametrize("ttl", [0, 0.0004, 0.25, 1, 1.5, 59.9996, 60, 90.25, 3600.001, 86400 * 30,
                                 10 * 365 * 86400, 70 * 365 * 86400, MAX_TTL_SECONDS])
def test_ttl_params_fit_dateadd_ints_and_add_up_to_the_ttl(ttl):
    ms, minutes = MSSQLDialect().ttl_params(ttl)
    for part in (ms, minutes):
        assert type(part) is int and 0 <= part <= INT_MAX
    assert ms < 60_000
    # What DATEADD(millisecond, ms, DATEADD(minute, minutes, now)) adds:
    assert dt.timedelta(minutes=minutes, milliseconds=ms) == dt.timedelta(milliseconds=round(ttl * 1000))


def test_ttl_params_examples():
    d = MSSQLDialect()
    assert d.ttl_params(10) == [10_000, 0]
    assert d.ttl_params(90.25) == [30_250, 1]
    ten_years = 10 * 365 * 86400
    assert d.ttl_params(ten_years) == [0, ten_years // 60]
    # Whole seconds would overflow DATEADD's int past ~68 years; minutes do not.
    assert MAX_TTL_SECONDS > INT_MAX and d.ttl_params(MAX_TTL_SECONDS)[1] < INT_MAX


def test_datetime_param_is_naive_utc():
    d = MSSQLDialect()
    assert d.datetime_param(None) is None
    plus2 = dt.timezone(dt.timedelta(hours=2))
    value = d.datetime_param(dt.datetime(2030, 1, 2, 14, 30, 5, 123000, tzinfo=plus2))
    assert value == dt.datetime(2030, 1, 2, 12, 30, 5, 123000) and value.tzinfo is None
    utc = dt.datetime(2030, 1, 2, 12, 0, tzinfo=dt.timezone.utc)
    assert d.datetime_param(utc) == dt.datetime(2030, 1, 2, 12, 0)
    # …and a naive datetime read back from the column is taken as UTC.
    assert d.to_datetime(d.datetime_param(utc)) == utc


def test_to_row_reads_what_pyodbc_returns():
    row = MSSQLDialect().to_row(("6F9619FF-8B86-D011-B42D-00C04FD430C8", None, "reply@x",
                                 dt.datetime(2030, 1, 1, 0, 0, 0), '{"a":"b"}', b"\x00\x01", 7, 1))
    assert row.id == "6f9619ff-8b86-d011-b42d-00c04fd430c8"
    assert row.expires == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    assert (row.body, row.row_version, row.expired, row.reply_to) == (b"\x00\x01", 7, True, "reply@x")


# -- 3. mssql-django itself, never connected ----------------------------------------------

@pytest.fixture
def mssql_connection(monkeypatch):
    """A mssql-django DatabaseWrapper for the DATABASE_URL below, never connected.

    The STACK-NOTES recipe: pre-fill the version / Azure probes (they would query
    the server) and report autocommit off (select_for_update checks it).  Any
    attempt to connect fails the test.
    """
    try:
        from mssql.base import DatabaseWrapper  # imports pyodbc → needs libodbc.so.2
    except ImportError as exc:  # pragma: no cover - environment problem
        pytest.fail(f"mssql-django cannot be imported ({exc}); apt-get install -y libodbc2 unixodbc")
    monkeypatch.setitem(DatabaseWrapper._known_versions, ALIAS, 2022)
    monkeypatch.setitem(DatabaseWrapper._known_azures, ALIAS, False)
    settings_dict = parse_database_url(MSSQL_URL, ROOT)
    handler = ConnectionHandler({"default": copy.deepcopy(settings_dict), ALIAS: copy.deepcopy(settings_dict)})
    conn = handler[ALIAS]
    assert isinstance(conn, DatabaseWrapper)

    def no_server(*args, **kwargs):
        raise AssertionError("the test tried to connect to SQL Server")

    monkeypatch.setattr(conn, "connect", no_server)
    monkeypatch.setattr(conn, "get_autocommit", lambda: False)
    yield conn
    assert conn.connection is None


def test_dialect_for_a_mssql_django_connection(mssql_connection):
    assert mssql_connection.vendor == "microsoft"
    assert mssql_connection.sql_server_version == 2022
    d = dialect_for(mssql_connection)
    assert isinstance(d, MSSQLDialect)
    assert d.table(NAME) == "[dbo].[orders]"
    assert dialect_for(mssql_connection, "sales").table(NAME) == "[sales].[orders]"


def test_queue_model_compiles_skip_locked_to_sql_server_hints(mssql_connection):
    model = queue_model(NAME)
    qs = model.objects.select_for_update(skip_locked=True).order_by("row_version")[:1]
    sql, params = qs.query.get_compiler(connection=mssql_connection).as_sql()
    assert sql.startswith("SELECT TOP 1 ")
    assert "FROM [orders] WITH (ROWLOCK, UPDLOCK, READPAST)" in sql
    assert sql.endswith("ORDER BY [orders].[RowVersion] ASC")
    for column in COLUMNS:
        assert f"[orders].[{column}]" in sql
    assert params == ()


class _DriverCursor:
    """Stands in for a pyodbc cursor: records what mssql-django hands the driver."""

    def __init__(self, log: list, rows_for, rowcounts: list):
        self.log, self.rows_for, self._rowcounts = log, rows_for, rowcounts
        self.rows, self.rowcount = [], -1

    def execute(self, sql, params=()):
        self.log.append(("execute", sql, tuple(params)))
        self.rows = list(self.rows_for(sql))
        self.rowcount = self._rowcounts.pop(0) if self._rowcounts else -1
        return self

    def executemany(self, sql, seq):
        self.log.append(("executemany", sql, [tuple(p) for p in seq]))

    def fetchall(self):
        return list(self.rows)

    def fetchone(self):
        return self.rows[0] if self.rows else None

    def nextset(self):  # mssql-django drains the result set after fetchone on non-Microsoft drivers
        return False

    def close(self):
        pass


def _queue_info(name: str, using: str | None = None) -> QueueInfo:
    return QueueInfo(name, "normal", None, False, None, None)


@pytest.fixture
def no_registry(monkeypatch):
    """The queue registry is a Django model on the real database: keep it out."""
    monkeypatch.setattr(registry, "get", _queue_info)


class _FakeMSSQLTransport(Transport):
    """The real Transport, on the never-connected mssql-django connection."""

    def __init__(self, conn, rows_for=lambda sql: (), rowcounts=()):
        super().__init__(using=ALIAS)
        self.conn, self.log, self.rows_for, self.rowcounts = conn, [], rows_for, list(rowcounts)

    @property
    def dialect(self):
        return dialect_for(self.conn)

    def _queue(self, name):
        validate_name(name)
        return _queue_info(name)

    def _announce_on_commit(self, queues, d):
        # The never-connected wrapper has no transaction to hook; the wake-up itself is
        # tests/test_wakeups.py's.
        self.announced = [*getattr(self, "announced", []), *queues]

    def _cursor(self):
        from mssql.base import CursorWrapper as MSSQLCursorWrapper

        driver = _DriverCursor(self.log, self.rows_for, self.rowcounts)
        return StatementCursor.around(DjangoCursorWrapper(MSSQLCursorWrapper(driver, self.conn), self.conn))


def _bound_values(sql: str, params: tuple) -> dict[str, object]:
    """Column → value of a driver-level single-row INSERT (``?`` placeholders)."""
    (values,) = _bound_rows(sql, params)
    return values


def _bound_rows(sql: str, params: tuple) -> list[dict[str, object]]:
    """Column → value per row of a driver-level (multi-row) INSERT (``?`` placeholders)."""
    counter = iter(range(1, len(params) + 1))
    tree = parse_one(re.sub(r"\?", lambda _: f"@P{next(counter)}", sql))
    names = {f"P{i + 1}": p for i, p in enumerate(params)}

    def value(node):
        if isinstance(node, exp.Parameter):
            return names[node.name]
        if isinstance(node, exp.DateAdd):
            return (node.unit.name.lower(), value(node.expression), value(node.this))
        if is_getutcdate(node):
            return "GETUTCDATE()"
        return node.this

    return [{c.name: value(v) for c, v in zip(tree.this.expressions, row.expressions)}
            for row in tree.expression.expressions]


def test_transport_statements_reach_the_driver_with_matching_params(mssql_connection, no_registry):
    """The transport's real call sites, through mssql-django's cursor wrapper."""
    d = MSSQLDialect()
    raw = (str(uuid.uuid4()).upper(), "corr", "reply@x", dt.datetime(2030, 1, 1), '{"NServiceBus.MessageId":"m1"}',
           b"body", 42, 0)
    d_sql = {d.receive(NAME).replace("%s", "?"): [raw], d.browse(NAME).replace("%s", "?"): [raw],
             d.peek_estimate(NAME): [(3,)]}
    t = _FakeMSSQLTransport(mssql_connection, rows_for=lambda sql: d_sql.get(sql, ()))

    message_id = t.send(NAME, {"x": 1}, ttl=90.25, correlation_id="corr", reply_to="reply@x")
    t.send(NAME, b"raw")                                          # no TTL
    t.send_many(NAME, ["a", "b"], ttl=dt.timedelta(days=3650))
    (received,) = t.receive_batch(NAME, 5)
    t.move(received, NAME, received.headers, keep_expiry=True)
    assert t.peek_estimate(NAME) == 3
    (browsed,) = t.browse(NAME, limit=50, after=41)
    assert browsed.id == received.id and browsed.headers == {"NServiceBus.MessageId": "m1"}
    t.delete(NAME, message_id)

    calls = t.log
    for kind, sql, params in calls:
        assert "%s" not in sql
        for p in (params if kind == "executemany" else [params]):
            assert sql.count("?") == len(p), (sql, p)

    two_rows, _ = d.insert_rows(NAME, [[None] * 7] * 2, True)
    expected_sql = [d.insert_with_ttl(NAME), d.insert_with_expires(NAME), two_rows, d.receive(NAME),
                    d.insert_with_expires(NAME), d.peek_estimate(NAME), d.browse(NAME), d.delete_by_id(NAME)]
    # mssql-django only swaps %s for ? (no GROUP BY rewrite, no other change).
    assert [sql for _, sql, _ in calls] == [s.replace("%s", "?") for s in expected_sql]

    send_ttl, send_plain, many, receive, requeue, peek, browse, delete = calls
    values = _bound_values(send_ttl[1], send_ttl[2])
    assert values["Id"] == row_id_for(message_id)
    assert (values["CorrelationId"], values["ReplyToAddress"], values["Recoverable"]) == ("corr", "reply@x", "1")
    assert json.loads(values["Headers"])["NServiceBus.MessageId"] == message_id
    assert values["Body"] == b'{"x":1}'
    assert values["Expires"] == ("millisecond", 30_250, ("minute", 1, "GETUTCDATE()"))

    assert _bound_values(send_plain[1], send_plain[2])["Expires"] is None
    assert many[0] == "execute" and len(many[2]) == 14  # send_many: one statement, two rows
    rows = _bound_rows(many[1], many[2])
    assert [r["Body"] for r in rows] == [b"a", b"b"]
    for row in rows:
        assert row["Expires"] == ("millisecond", 0, ("minute", 3650 * 24 * 60, "GETUTCDATE()"))
    assert t.announced == [NAME] * 4  # each insert wakes the queue's pumps at commit

    assert receive[2] == (5,)
    assert (received.id, received.row_version, received.expired) == (raw[0].lower(), 42, False)
    assert received.expires == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    requeued = _bound_values(requeue[1], requeue[2])
    assert requeued["Id"] == received.id and requeued["Body"] == b"body"
    assert requeued["Expires"] == dt.datetime(2030, 1, 1) and requeued["Expires"].tzinfo is None
    assert peek[2] == () and browse[2] == (41, 50) and delete[2] == (row_id_for(message_id),)


@pytest.mark.parametrize("ends, estimate", [((5, 9), 5), ((5, None), 0), ((None, 9), 0), ((7, 5), 0),
                                             ((None, None), 0)])
def test_a_pumps_look_reads_both_ends_without_locks_and_a_receive_between_them_is_no_error(
        mssql_connection, no_registry, ends, estimate):
    """SQL Server reads the two ends of a pump's look (peek_range) each without locks, so a
    receive between them can leave one end or put the high end below the low: no rows
    waiting, never a negative estimate or a TypeError in the pump."""
    from core.runtime.marks import receive_marks

    d = MSSQLDialect()
    looks = {d.peek_range(NAME).replace("%s", "?"), d.peek_range(NAME, from_mark=True).replace("%s", "?")}
    t = _FakeMSSQLTransport(mssql_connection, rows_for=lambda sql: [ends] if sql in looks else ())
    receive_marks.forget()
    try:
        assert t.peek_estimate(NAME, from_mark=True) == estimate
        assert [sql for _, sql, _ in t.log] == [d.peek_range(NAME)]  # no mark yet: from the start
    finally:
        receive_marks.forget()


def test_purge_and_counts_reach_the_driver(mssql_connection, no_registry):
    t = _FakeMSSQLTransport(mssql_connection, rowcounts=[10, 10, 3])
    assert t.purge(NAME, expired_only=True, batch_size=10) == 23
    assert [c[2] for c in t.log] == [(10,), (10,), (10,)]
    assert {c[1] for c in t.log} == {MSSQLDialect().purge_expired(NAME).replace("%s", "?")}

    t = _FakeMSSQLTransport(mssql_connection, rows_for=lambda sql: [(5, 2)])
    counts = t.counts(NAME)
    assert (counts.total, counts.expired, counts.exact) == (5, 2, False)  # NOLOCK: not exact
    assert t.log == [("execute", MSSQLDialect().counts(NAME), ())]


# -- 4. the mssql DATABASE_URL ----------------------------------------------------------------

def test_mssql_database_url():
    s = parse_database_url(MSSQL_URL, ROOT)
    assert s["ENGINE"] == "mssql"
    assert (s["NAME"], s["USER"], s["PASSWORD"], s["HOST"], s["PORT"]) == ("sluice", "sa", "p@ss", "db", "1433")
    assert s["OPTIONS"] == {
        "driver": "ODBC Driver 18 for SQL Server",
        "python_driver": "mssql_python",
        "extra_params": "TrustServerCertificate=yes",
    }
    with pytest.raises(DatabaseUrlError):
        parse_database_url("mssql://sa:pw@db:1433/", ROOT)


def test_mssql_database_url_gives_mssql_django_a_usable_connection_string(mssql_connection):
    params = mssql_connection.get_connection_params()
    assert mssql_connection._uses_mssql_python(params)
    cstr = mssql_connection._build_connection_string(params, params["OPTIONS"]["driver"])
    parts = dict(p.split("=", 1) for p in cstr.split(";"))
    assert parts["SERVER"] == "db,1433" and parts["UID"] == "sa" and parts["DATABASE"] == "sluice"
    assert parts["PWD"].strip("{}") == "p@ss"
    assert parts["TrustServerCertificate"] == "yes"
    assert "DRIVER" not in parts  # mssql-python bundles its own driver


def test_a_dialect_must_define_every_sql_fragment():
    """The generic statements are written once from the fragments; a dialect that leaves
    one out fails when it is made, not with broken SQL later."""
    from core.dialects.base import FRAGMENTS

    class Incomplete(MSSQLDialect):
        nolock_hint = None

    with pytest.raises(TypeError, match="nolock_hint"):
        Incomplete()
    d = MSSQLDialect()
    assert all(isinstance(getattr(d, f), str) for f in FRAGMENTS)
    # The generic forms carry SQL Server's fragments: hints after the table, the limit last.
    assert d.delayed_fetch_due(NAME).endswith("ORDER BY [Time] OFFSET 0 ROWS FETCH NEXT %s ROWS ONLY")
    assert "[dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE" in d.delayed_fetch_due(NAME)
    assert d.delayed_fetch_params("at", 10) == ["at", 10]


def test_the_movers_claim_takes_due_rows_as_the_receive_does():
    """The mover's one-statement fetch-and-remove: a CTE over the due rows in Time order,
    TOP (%s) first — so its parameters are (limit, at), not the fetch's (at, limit) —
    rows other movers hold passed over, and the deleted rows' columns OUTPUT."""
    d = MSSQLDialect()
    sql = d.delayed_claim_due(NAME)
    assert sql.startswith("SET NOCOUNT ON; WITH message AS (SELECT TOP (%s) * FROM [dbo].[orders] "
                          "WITH (UPDLOCK, READPAST, ROWLOCK) WHERE [Time] <= COALESCE(%s, GETUTCDATE()) "
                          "ORDER BY [Time]) DELETE FROM message OUTPUT deleted.[Id], ")
    assert sql.endswith("deleted.[RetryCount];")
    assert d.delayed_claim_params("at", 10) == [10, "at"]


def test_multi_row_inserts_stay_within_the_parameter_limit_and_keep_list_order():
    d = MSSQLDialect()
    for per_row in (5 + len(d.ttl_params(60)), 6):
        rows = d.insert_rows_per_statement(per_row)
        assert rows * per_row <= d.max_parameters < 2100
        sql, params = d.insert_rows(NAME, [[None] * per_row] * rows, with_ttl=per_row != 6)
        assert len(params) <= 2100 and placeholders(sql) == len(params)
    # The delayed store's chunk (SqlDelayedStore.store_many: max_parameters // per-row params).
    per_row = len(d.delayed_insert_many_params([("id", "dest", b"", d.ttl_params(5), "{}")]))
    assert (d.max_parameters // per_row) * per_row <= 2100
    # Multi-row VALUES rows come out in list order (one INSERT, rows as given).
    tree = parse_one(bind(*d.insert_rows(NAME, [[None] * 7] * 3, True)[:1], 21))
    assert len(tree.expression.expressions) == 3
    many = parse_one(bind(d.delayed_insert_many(NAME, 2, after=False).removeprefix("SET NOCOUNT ON; "), 10))
    assert isinstance(many, exp.Insert) and many.find(exp.Values) is not None and many.find(exp.Exists) is not None


# -- 5. a foreign row's retry (issue 34) ------------------------------------------------------

def test_the_address_columns_are_as_wide_as_the_check_on_copied_values():
    from core.outgoing import MAX_ADDRESS_LENGTH

    (create, _), *_ = MSSQLDialect().create_queue_table(NAME)
    for column in ("CorrelationId", "ReplyToAddress"):
        assert f"[{column}] varchar({MAX_ADDRESS_LENGTH}) NULL" in create


def test_a_foreign_rows_retry_binds_only_what_its_columns_take(mssql_connection, no_registry):
    """A row another system wrote: a 300-character CorrelationId header (its column NULL)
    and a lone surrogate in a header (valid JSON text).  The retry's INSERT binds no
    CorrelationId that varchar(255) would refuse, and header text the driver can encode."""
    d = MSSQLDialect()
    long = "c" * 300
    text = json.dumps({"NServiceBus.MessageId": "m1", "NServiceBus.CorrelationId": long, "Foreign.Note": "a \ud800 b"})
    raw = (str(uuid.uuid4()), None, None, None, text, b"body", 42, 0)
    receive = d.receive(NAME).replace("%s", "?")
    t = _FakeMSSQLTransport(mssql_connection, rows_for=lambda sql: [raw] if sql == receive else ())

    (received,) = t.receive_batch(NAME, 1)
    t.move(received, NAME, {**received.headers, "Sluice.FailedAttempts": "1"}, keep_expiry=True)

    _, sql, params = t.log[-1]
    assert sql == d.insert_with_expires(NAME).replace("%s", "?")
    values = _bound_values(sql, params)
    assert values["CorrelationId"] is None
    values["Headers"].encode("utf-16-le")  # nvarchar: what the driver sends; a lone surrogate raises
    headers = json.loads(values["Headers"])
    assert headers["NServiceBus.CorrelationId"] == long and headers["Foreign.Note"] == "a \ud800 b"


def test_a_task_enqueue_is_one_batch_returning_the_result_rows_time():
    """A task's message and its result row in one round trip: the queue's INSERT, then the
    result's INSERT … OUTPUT, NOCOUNT on so the OUTPUT row is the first result."""
    from core.dialects.tasks_sql import MSSQLTaskSQL  # noqa: F401 (the dialect's mixin)

    d = MSSQLDialect()
    insert_sql, params = d.insert_rows(NAME, [[uuid.uuid4(), None, None, *d.ttl_params(60), "{}", b"x"]], True)
    along = d.insert_returning("sluice_task_result", ["id", "status"], "enqueued_at")
    sql = d.insert_along(insert_sql, along)
    assert sql.startswith("SET NOCOUNT ON; ") and sql.index(insert_sql) < sql.index(along)
    assert placeholders(sql) == len(params) + 2
    assert "OUTPUT inserted.[enqueued_at]" in sql


# -- per-queue limits (core/dialects/limits_sql.py, core/receive/permits.py) ---------------------

#: Each limits statement with the params core.receive.permits passes.
LIMITS_STATEMENTS = {
    "take_slot": (lambda d: d.take_slot(), 3),             # [queue, concurrency, 1]
    "take_tickets": (lambda d: d.take_tickets(), 3),       # [queue, rate, how many]
    "use_tickets": (lambda d: d.use_tickets(3), 4),        # [queue, *3 ticket numbers]
    "next_ticket": (lambda d: d.next_ticket(), 2),         # [queue, rate]
}


def test_every_limits_statement_is_checked():
    from core.dialects.limits_sql import LimitsSQL

    public = {n for n, v in vars(LimitsSQL).items() if callable(v) and not n.startswith("_")}
    assert public == set(LIMITS_STATEMENTS)


@pytest.mark.parametrize("what", sorted(LIMITS_STATEMENTS))
def test_limits_statements_parse_as_tsql_with_their_params(what):
    make, n_params = LIMITS_STATEMENTS[what]
    for schema in (None, "sales"):  # Sluice's own tables: never in SLUICE_SCHEMA
        sql = make(MSSQLDialect(schema))
        assert "sales" not in sql
        parse_one(bind(sql, n_params))


@pytest.mark.parametrize("what, column", [("take_slot", "slot"), ("take_tickets", "ticket")])
def test_a_receive_locks_free_limit_rows_skipping_those_others_hold(what, column):
    sql = LIMITS_STATEMENTS[what][0](MSSQLDialect())
    select = parse_one(bind(sql, 3))
    table = select.args["from_"].this
    assert table.name == f"sluice_queue_{column}" and table.this.quoted
    assert hints(table) == ["UPDLOCK", "READPAST", "ROWLOCK"]  # row locks held to the commit, others passed over
    (order,) = select.args["order"].expressions
    assert_column(order.this, column)
    assert param_name(select.args["limit"].args["count"]) == "P3"  # OFFSET 0 ROWS FETCH NEXT @P3 ROWS ONLY
    where = select.args["where"].sql("tsql")
    assert "[queue] = @P1" in where and f"[{column}] <= @P2" in where
    if what == "take_tickets":
        assert "[used_at] <= DATEADD(SECOND, -1, GETUTCDATE())" in where  # the database's clock


def test_spent_tickets_take_the_database_clock_and_next_ticket_reads_it():
    d = MSSQLDialect()
    update = parse_one(bind(d.use_tickets(3), 4))
    assert isinstance(update, exp.Update)
    (assignment,) = update.expressions
    assert_column(assignment.this, "used_at") and is_getutcdate(assignment.expression)
    assert "[ticket] IN (@P2, @P3, @P4)" in update.args["where"].sql("tsql")
    select = parse_one(bind(d.next_ticket(), 2))
    assert isinstance(select.expressions[0], exp.Min) and is_getutcdate(select.expressions[1])
