"""The measurements alert rules read (core/monitoring/measurements.py): bounded statements, the same
numbers on every database, and the SQL Server statement it would send (no server here)."""
from __future__ import annotations

import pytest
from sqlglot import exp

from core.monitoring import measurements as m
from core.dialects.mssql import MSSQLDialect
from core.dialects.postgresql import PostgreSQLDialect
from core.dialects.sqlite import SQLiteDialect
from core.transport import Transport
from tests.test_dialect_mssql import assert_table, bind, hints, parse_one


def test_mssql_queue_levels_parse_and_are_bounded():
    d = MSSQLDialect()
    sql = d.queue_levels(["orders", "billing"], 101)
    assert "%s" not in sql  # positions and cap written in: a generic plan when prepared
    tree = parse_one(bind(sql, 0))
    assert isinstance(tree, exp.Union)
    tables = list(tree.find_all(exp.Table))
    assert {t.name for t in tables} == {"orders", "billing"}
    for table in tables:
        assert_table(table, table.name)
        assert hints(table) == ["NOLOCK"]
    for count in tree.find_all(exp.Count):  # every count reads a TOP (101) subquery
        inner = count.find_ancestor(exp.Select).args["from_"].this.this
        assert isinstance(inner, exp.Select) and inner.args.get("limit") is not None


def test_queue_levels_bind_no_parameters_in_any_dialect():
    """Positions and the cap are in the text: prepared on PostgreSQL, the statement then gets
    a generic plan instead of being planned again on every evaluation."""
    for d in (SQLiteDialect(), PostgreSQLDialect(), MSSQLDialect()):
        sql = d.queue_levels(["a", "b", "c"], 10)
        assert "%s" not in sql and sql.count(" UNION ALL ") == 2
        assert sql.count("LIMIT 10)") + sql.count("TOP (10)") == 3
        assert [sql.count(f"SELECT {position}, ") for position in range(3)] == [1, 1, 1]


@pytest.mark.django_db(transaction=True)
def test_queue_levels_count_exactly_up_to_the_cap_then_estimate(make_queue, settings):
    small, big = make_queue(), make_queue()
    Transport().send_many(small, ["x"] * 3)
    Transport().send_many(big, ["x"] * 30)
    levels = {q.name: q for q in m.queue_levels([small, big], cap=10)}
    assert (levels[small].pending, levels[small].estimated) == (3, False)
    assert (levels[big].pending, levels[big].estimated) == (30, True)
    assert levels[small].oldest_age_seconds is not None and levels[small].oldest_age_seconds < 60


def test_filters_match_with_wildcards():
    assert m.matches(None, "x") and m.matches("", "x") and m.matches("*", "")
    assert m.matches("orders*", "orders.eu") and not m.matches("orders*", "billing")
    assert m.matches("*Error", "KeyError") and not m.matches("KeyError", "ValueError")
