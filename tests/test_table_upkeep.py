"""PostgreSQL queue-table upkeep: every queue table and the delayed store carry autovacuum
settings for a table whose rows are deleted soon after they are inserted, set when the
table is made and put back by ``sluice setup`` on tables that lack them; they stay logged."""
from __future__ import annotations

import pytest
from django.db import connection

from core.dialects.postgresql import TABLE_UPKEEP
from core.queues import apply_table_upkeep, dialect
from core.setup import setup_infrastructure
from tests.test_delayed import store  # noqa: F401 — the fixture

pytestmark = pytest.mark.postgresql

WANTED = {f"{key}={value}" for key, value in TABLE_UPKEEP}


def storage(table: str) -> tuple[set[str], str]:
    """(reloptions, relpersistence) of a table in the connection's schema."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions, relpersistence FROM pg_class WHERE oid = to_regclass(%s)",
                       [dialect().table(table)])
        options, persistence = cursor.fetchone()
    return set(options or ()), persistence


def test_a_new_queue_table_gets_the_autovacuum_settings_and_stays_logged(queue):
    options, persistence = storage(queue)
    assert WANTED <= options
    assert "autovacuum_vacuum_scale_factor=0" in options and "autovacuum_vacuum_threshold=1000" in options
    assert persistence == "p"  # permanent (logged), not unlogged


def test_setup_gives_an_existing_table_the_settings_again_idempotently(make_queue):
    old = make_queue()
    with connection.cursor() as cursor:  # a table made before Sluice set them
        cursor.execute(f"ALTER TABLE {dialect().table(old)} RESET "
                       f"({', '.join(key for key, _ in TABLE_UPKEEP)})")
    assert not WANTED & storage(old)[0]
    setup_infrastructure()
    assert WANTED <= storage(old)[0]
    assert old in apply_table_upkeep()  # again: no error, same settings
    assert WANTED <= storage(old)[0] and storage(old)[1] == "p"


def test_the_delayed_store_table_gets_them_too(store):  # noqa: F811
    options, persistence = storage(store.table)
    assert WANTED <= options and persistence == "p"


def test_setup_warns_when_the_server_has_autovacuum_off(transactional_db, caplog):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')")
        on = cursor.fetchone()[0] == "on"
    with caplog.at_level("WARNING", logger="sluice.queues"):
        apply_table_upkeep()
    warned = any("autovacuum is off" in r.getMessage() for r in caplog.records)
    assert warned == (not on)  # per-table settings cannot turn it on
