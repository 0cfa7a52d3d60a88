"""Settings: DATABASE_URL parsing and SLUICE_* options from the environment."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.conf import SluiceSettings, from_environ
from sluice.dburl import DatabaseUrlError, parse_database_url

BASE = Path("/srv/app")


def test_sqlite_urls():
    rel = parse_database_url("sqlite:///var/db.sqlite3", BASE)
    assert rel["NAME"] == "/srv/app/var/db.sqlite3"
    assert rel["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert parse_database_url("sqlite:////tmp/x.sqlite3", BASE)["NAME"] == "/tmp/x.sqlite3"


def test_postgresql_url():
    db = parse_database_url("postgresql://u:p%40ss@db.local:6543/app?sslmode=require", BASE)
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == ("u", "p@ss", "db.local", "6543", "app")
    assert db["OPTIONS"] == {"sslmode": "require"}


@pytest.mark.parametrize("url", ["mysql://x/y", "sqlite://", "postgresql://host/", "nonsense"])
def test_bad_database_urls(url):
    with pytest.raises(DatabaseUrlError):
        parse_database_url(url, BASE)


def test_sluice_options_from_the_environment():
    values = from_environ({"SLUICE_CONCURRENCY": "8", "SLUICE_PEEK_DELAY": "0.5",
                           "SLUICE_QUEUES": "a, b", "SLUICE_HANDLER_MODULES": '["x.y"]', "OTHER": "1"})
    assert values == {"SLUICE_CONCURRENCY": 8, "SLUICE_PEEK_DELAY": 0.5, "SLUICE_QUEUES": ("a", "b"),
                      "SLUICE_HANDLER_MODULES": ("x.y",)}


def test_bad_options_are_refused_with_their_name():
    with pytest.raises(ValueError, match="SLUICE_CONCURRENCY"):
        from_environ({"SLUICE_CONCURRENCY": "many"})
    with pytest.raises(ValueError, match="SLUICE_PEEK_DELAY"):
        SluiceSettings(PEEK_DELAY=0.005)
    with pytest.raises(ValueError, match="SLUICE_TRANSACTION_MODE"):
        SluiceSettings(TRANSACTION_MODE="yolo")


def test_sqlite_without_immediate_transactions_fails_the_system_check():
    from core.checks import sqlite_problems

    plain = {"ENGINE": "django.db.backends.sqlite3", "NAME": "x", "OPTIONS": {}}
    assert [e.id for e in sqlite_problems(plain)] == ["sluice.E001"]
    assert sqlite_problems(parse_database_url("sqlite:///x.sqlite3", BASE)) == []
    assert sqlite_problems(parse_database_url("postgresql://h/db", BASE)) == []


def test_sql_server_returning_bulk_inserts_fail_the_system_check():
    """sluice_failed_message has a trigger: SQL Server refuses INSERT … OUTPUT on it."""
    from core.checks import mssql_problems

    url = "mssql://sa:pw@db:1433/sluice?python_driver=mssql_python&TrustServerCertificate=yes"
    assert mssql_problems(parse_database_url(url, BASE)) == []
    returning = {"ENGINE": "mssql", "NAME": "sluice", "OPTIONS": {"return_rows_bulk_insert": True}}
    [error] = mssql_problems(returning)
    assert error.id == "sluice.E004" and "return_rows_bulk_insert" in error.msg
    assert mssql_problems(parse_database_url("postgresql://h/db", BASE)) == []
