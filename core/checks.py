"""Django system checks for Sluice's configuration."""
from __future__ import annotations

import os
from typing import Any, Mapping

from django.conf import settings
from django.core import checks
from django.db import connections

from core.conf import get_settings
from core.outbox import retention_warnings


def sqlite_problems(db: Mapping[str, Any]) -> list[checks.CheckMessage]:
    """SQLite receives need BEGIN IMMEDIATE, or two receivers deadlock upgrading locks."""
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return []
    if (db.get("OPTIONS") or {}).get("transaction_mode") in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [checks.Error(
        "Sluice on SQLite needs DATABASES[...]['OPTIONS']['transaction_mode'] = 'IMMEDIATE'",
        hint="Without it two receivers can deadlock when they upgrade their read locks.",
        id="sluice.E001",
    )]


def mssql_problems(db: Mapping[str, Any]) -> list[checks.CheckMessage]:
    """mssql-django's return_rows_bulk_insert makes bulk_create send INSERT … OUTPUT, which
    SQL Server refuses on a table with a trigger, as sluice_failed_message has (it keeps the
    failed-message counts: core/dialects/failed_counts_sql.py)."""
    if db.get("ENGINE") != "mssql" or not (db.get("OPTIONS") or {}).get("return_rows_bulk_insert"):
        return []
    return [checks.Error(
        "Sluice on SQL Server needs mssql-django's OPTIONS['return_rows_bulk_insert'] off (its default)",
        hint="SQL Server refuses bulk inserts that return rows into sluice_failed_message, which has a trigger.",
        id="sluice.E004",
    )]


@checks.register(checks.Tags.database)
def sluice_database(app_configs=None, **kwargs):
    try:
        conf = get_settings()
    except ValueError as exc:
        return [checks.Error(str(exc), id="sluice.E002")]
    db = connections.settings.get(conf.DATABASE)
    if db is None:
        return [checks.Error(f"SLUICE_DATABASE={conf.DATABASE!r} is not in DATABASES", id="sluice.E003")]
    return sqlite_problems(db) + mssql_problems(db)


@checks.register()
def sluice_outbox_retention(app_configs=None, **kwargs):
    """De-duplication data must outlive every retry of a message, or a late copy slips through."""
    try:
        conf = get_settings()
    except ValueError:
        return []  # reported by sluice_database
    return [checks.Warning(text, hint="raise SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR", id="sluice.W001")
            for text in retention_warnings(conf)]


@checks.register()
def sluice_redis(app_configs=None, **kwargs):
    """Worker heartbeats, the dashboard's shared counts and the Celery broker live in Redis:
    a project that names none runs against a local default it may not have."""
    named = any(hasattr(settings, name) for name in ("SLUICE_REDIS_URL", "REDIS_URL")) or \
        any(name in os.environ for name in ("SLUICE_REDIS_URL", "REDIS_URL"))
    if named:
        return []
    return [checks.Warning(
        f"no Redis named: Sluice uses {get_settings().REDIS_URL} for worker heartbeats, the dashboard's "
        "shared counts and the Celery broker",
        hint='set SLUICE_REDIS_URL = "redis://host:6379/0" in settings (or the environment variable)',
        id="sluice.W002")]
