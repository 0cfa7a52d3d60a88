"""The export's horizon on PostgreSQL (core.records.horizon, the dialect's record_horizon):
it waits for exactly the transactions that can still commit a record id below it — this
database's, including those that took their transaction id after the horizon's snapshot
was made — and not for transactions in other databases of the same server."""
from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from core.records import horizon
from core.records.writer import insert_rows

pytestmark = pytest.mark.postgresql


def open_writing_transaction(dbname: str) -> psycopg.Connection:
    """A transaction on ``dbname`` that has written (so it holds a transaction id) and stays open."""
    params = connection.settings_dict
    conn = psycopg.connect(host=params["HOST"] or None, port=params["PORT"] or None, user=params["USER"],
                           password=params["PASSWORD"] or None, dbname=dbname)
    conn.execute("CREATE TEMP TABLE holds_an_xid (x int)")  # BEGIN is implicit: no autocommit
    return conn


def test_an_open_transaction_in_another_database_does_not_hold_the_horizon(transactional_db):
    insert_rows([("h-1", None, "q-horizon", "e", None, 1, 2, "processed", 1, None)], "default")
    other = open_writing_transaction("postgres")
    try:
        taken = horizon.take("default")
        assert horizon.settled(taken, "default", delay=600), taken.token
    finally:
        other.rollback()
        other.close()


def test_an_open_transaction_of_this_database_holds_the_horizon_until_it_ends(transactional_db):
    """Its transaction id is newer than every completed one, so PostgreSQL's snapshot leaves
    it out of its in-progress list (it is at or past xmax): the horizon must list it itself."""
    insert_rows([("h-2", None, "q-horizon", "e", None, 1, 2, "processed", 1, None)], "default")
    mine = open_writing_transaction(connection.settings_dict["NAME"])
    try:
        taken = horizon.take("default")
        assert not horizon.settled(taken, "default", delay=600), taken.token
    finally:
        mine.rollback()
        mine.close()
    assert horizon.settled(taken, "default", delay=600)


def test_tokens_of_older_versions_are_still_read(transactional_db):
    """Stored watermarks hold pg_snapshot text ("xmin:xmax:xip,…"), as older versions wrote
    them: the settled check reads that text and waits for the transactions it lists."""
    mine = open_writing_transaction(connection.settings_dict["NAME"])
    try:
        xid, = mine.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        # Only our own transaction listed: a whole-server snapshot would also list other test
        # shards' transactions, which may stay open for minutes under CI load.
        old_token = f"{xid}:{xid + 1}:{xid}"
        assert not horizon.settled(horizon.Horizon(1, old_token, 0), "default", delay=600)
    finally:
        mine.commit()
        mine.close()
    assert horizon.settled(horizon.Horizon(1, old_token, 0), "default", delay=600)


def test_a_stored_horizon_reads_back_whole():
    from core.models.records import ExportWatermark

    row = ExportWatermark(horizon_id=7, horizon_token="100:105:", horizon_us=1_700_000_000_000_000)
    assert horizon.Horizon.of(row) == horizon.Horizon(7, "100:105:", 1_700_000_000_000_000)


@pytest.mark.django_db
def test_without_a_commit_snapshot_a_horizon_settles_once_the_delay_has_passed():
    """SQL Server's way (no snapshot token), on any database with concurrent writers: the
    horizon settles SLUICE_RECORDS_EXPORT_DELAY seconds after it was taken, not before."""
    from core.dialects import dialect_for
    from core.records.writer import now_us

    if not dialect_for(connection).supports_concurrent_writers:
        pytest.skip("one writer at a time: a horizon settles at once")
    taken = now_us()
    assert not horizon.settled(horizon.Horizon(7, "", taken), "default", delay=60)
    assert not horizon.settled(horizon.Horizon(7, "", taken - 59_000_000), "default", delay=60)
    assert horizon.settled(horizon.Horizon(7, "", taken - 60_000_000), "default", delay=60)
    assert horizon.settled(horizon.Horizon(None, "", taken), "default", delay=60)  # no horizon: nothing to wait for
