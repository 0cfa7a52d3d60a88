"""The measurements alert rules read (core/measurements.py): bounded statements, the same
numbers on every database, and the SQL Server statement it would send (no server here)."""
from __future__ import annotations

import pytest
from sqlglot import exp

from core import measurements as m
from core.dialects.mssql import MSSQLDialect
from core.dialects.postgresql import PostgreSQLDialect
from core.dialects.sqlite import SQLiteDialect
from core.transport import Transport
from tests.test_dialect_mssql import assert_table, bind, hints, parse_one


def test_mssql_queue_levels_parse_and_are_bounded():
    d = MSSQLDialect()
    sql = d.queue_levels(["orders", "billing"])
    params = d.queue_levels_params(2, 101)
    assert params == [0, 101, 1, 101]
    tree = parse_one(bind(sql, len(params)))
    assert isinstance(tree, exp.Union)
    tables = list(tree.find_all(exp.Table))
    assert {t.name for t in tables} == {"orders", "billing"}
    for table in tables:
        assert_table(table, table.name)
        assert hints(table) == ["NOLOCK"]
    for count in tree.find_all(exp.Count):  # every count reads a TOP (@P) subquery
        inner = count.find_ancestor(exp.Select).args["from_"].this.this
        assert isinstance(inner, exp.Select) and inner.args.get("limit") is not None


def test_every_dialect_binds_the_same_parameters():
    for d in (SQLiteDialect(), PostgreSQLDialect(), MSSQLDialect()):
        assert d.queue_levels(["a", "b", "c"]).count("%s") == len(d.queue_levels_params(3, 10))


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
