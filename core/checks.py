"""Django system checks for Sluice's configuration."""
from __future__ import annotations

from typing import Any, Mapping

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


@checks.register(checks.Tags.database)
def sluice_database(app_configs=None, **kwargs):
    try:
        conf = get_settings()
    except ValueError as exc:
        return [checks.Error(str(exc), id="sluice.E002")]
    db = connections.settings.get(conf.DATABASE)
    if db is None:
        return [checks.Error(f"SLUICE_DATABASE={conf.DATABASE!r} is not in DATABASES", id="sluice.E003")]
    return sqlite_problems(db)


@checks.register()
def sluice_outbox_retention(app_configs=None, **kwargs):
    """De-duplication data must outlive every retry of a message, or a late copy slips through."""
    try:
        conf = get_settings()
    except ValueError:
        return []  # reported by sluice_database
    return [checks.Warning(text, hint="raise SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR", id="sluice.W001")
            for text in retention_warnings(conf)]
