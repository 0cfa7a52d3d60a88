"""The dashboard's statistics SQL: the T-SQL parses (as tests/test_dialect_mssql.py checks the
transport's), with the placeholders its callers bind, and never counts a whole table."""
from __future__ import annotations


from sqlglot import exp

from core.dialects.mssql import MSSQLDialect
from core.dialects.postgresql import PostgreSQLDialect
from core.dialects.sqlite import SQLiteDialect
from tests.test_dialect_mssql import assert_table, bind, hints, parse_one

#: The dialect methods this file checks (tests/test_dialect_mssql.py leaves them to it).
DASHBOARD_STATEMENTS = {"queue_stats", "queue_stats_params", "delayed_stats", "failed_search_expression",
                        "failed_search_indexes"}


def test_mssql_queue_stats_parses_and_is_bounded():
    d = MSSQLDialect()
    sql = d.queue_stats(["orders", "billing"])
    params = d.queue_stats_params(2, 1001)
    assert params == [0, 1001, 1001, 1, 1001, 1001]
    tree = parse_one(bind(sql, len(params)))
    assert isinstance(tree, exp.Union)
    tables = list(tree.find_all(exp.Table))
    assert {t.name for t in tables} == {"orders", "billing"}
    for table in tables:
        assert_table(table, table.name)
        assert hints(table) == ["NOLOCK"]  # estimates never wait on a receiver's locks
    # Every COUNT(*) reads a TOP (@P) subquery: bounded however big the queue is.
    for count in tree.find_all(exp.Count):
        select = count.find_ancestor(exp.Select)
        inner = select.args["from_"].this.this
        assert isinstance(inner, exp.Select) and inner.args.get("limit") is not None


def test_mssql_delayed_stats_parses_and_is_bounded():
    d = MSSQLDialect()
    sql = d.delayed_stats("sluice.delayed")
    tree = parse_one(bind(sql, 1))
    inner = tree.args["from_"].this.this
    assert isinstance(inner, exp.Select) and inner.args.get("limit") is not None
    (table,) = list(tree.find_all(exp.Table))
    assert_table(table, "sluice.delayed")


def test_every_dialect_binds_the_same_parameters():
    for d in (SQLiteDialect(), PostgreSQLDialect(), MSSQLDialect()):
        assert d.queue_stats(["a", "b", "c"]).count("%s") == len(d.queue_stats_params(3, 10))
        assert d.delayed_stats("t").count("%s") == 1
    assert MSSQLDialect().failed_search_expression() is None and SQLiteDialect().failed_search_indexes() == []
    assert "gin_trgm_ops" in PostgreSQLDialect().failed_search_indexes()[1][0]


