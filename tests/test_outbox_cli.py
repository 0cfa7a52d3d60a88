"""`sluice outbox list | dispatch | cleanup | stats` and their stable --json formats.

Most calls run the command in this process (:func:`tests.cli_support.sluice_here`: the same
command and error handling, without a Python start-up each); ``stats --json``, an error's
exit code and a setting from the environment go through a real ``manage.py`` process."""
from __future__ import annotations

import json

from django.db import connections

from core.outbox import Outbox, OutboxSession
from core.transport import Transport
from tests.cli_support import sluice_here
from tests.conftest import manage


def ok(*args: str) -> str:
    """``sluice outbox ARGS`` in this process; it must succeed.  Its stdout."""
    result = sluice_here("outbox", *args)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def ok_process(*args: str) -> str:
    """Like :func:`ok`, through a real ``manage.py`` child process."""
    result = manage("sluice", "outbox", *args)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def stuck_session(message_id: str, queue: str, monkeypatch) -> None:
    """A session whose process died between the commit and phase 2."""
    with monkeypatch.context() as patch:
        patch.setattr(Outbox, "after_commit", lambda self, ids: None)
        with OutboxSession(message_id=message_id) as session:
            session.send(queue, "x")
            session.send(queue, "y")


def test_stats_and_list_show_undispatched_and_quarantined_records(outbox, queue, monkeypatch):
    with OutboxSession(message_id="done"):
        pass
    stuck_session("stuck", queue, monkeypatch)
    stuck_session("broken", queue, monkeypatch)
    d = outbox.store.dialect
    with connections["default"].cursor() as cursor:
        cursor.execute(f'UPDATE {d.table(outbox.store.table)} SET {d.quote("Operations")} = %s '
                       f'WHERE {d.quote("MessageId")} = %s', ["not json", "broken"])
    outbox.dispatch(["broken"])  # quarantines it

    stats = json.loads(ok_process("stats", "--json"))  # the real entry point's stdout
    assert {"records", "undispatched", "bytes", "oldest_undispatched_age_s"} <= set(stats)
    assert (stats["records"], stats["undispatched"], stats["quarantined"]) == (3, 2, 1)
    assert stats["bytes"] > 0 and stats["oldest_undispatched_age_s"] >= 0

    listing = {r["message_id"]: r for r in json.loads(ok("list", "--undispatched", "--json"))}
    assert set(listing) == {"stuck", "broken"}
    assert listing["stuck"]["destinations"] == [queue, queue] and listing["stuck"]["operations"] == 2
    assert listing["broken"]["quarantined"] is True and listing["broken"]["destinations"] is None
    assert listing["broken"]["last_error"].startswith("quarantined:")
    assert {"message_id", "dispatched", "dispatched_at", "created_at", "persistence_version", "operations",
            "destinations", "quarantined", "last_error", "bytes"} == set(listing["stuck"])
    text = ok("list")
    assert "quarantined" in text and "<unreadable>" in text and "done" in text


def test_dispatch_one_record_or_all_then_clean_up(outbox, queue, make_queue, monkeypatch):
    other = make_queue()
    stuck_session("one", queue, monkeypatch)
    stuck_session("two", other, monkeypatch)
    assert "dispatched 1 record(s)" in ok("dispatch", "one")
    assert Transport().counts(queue).total == 2 and Transport().counts(other).total == 0
    assert "dispatched already" in ok("dispatch", "one")
    assert "dispatched 1 record(s)" in ok("dispatch")
    assert Transport().counts(other).total == 2
    missing = manage("sluice", "outbox", "dispatch", "nope")
    assert missing.returncode != 0 and "no outbox record 'nope'" in missing.stderr.decode()
    assert "deleted 0 outbox record(s)" in ok("cleanup")  # kept for 7 days
    result = manage("sluice", "outbox", "cleanup", env={"SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR": "0"})
    assert "deleted 2 outbox record(s)" in result.stdout.decode()
