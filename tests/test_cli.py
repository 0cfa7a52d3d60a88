"""`python manage.py sluice …`: the command line and its stable --json formats.

Most calls run the command in this process (:func:`tests.cli_support.sluice_here`: the same
command, parser and error handling, without a Python start-up each).  Each command family
still runs through the real ``manage.py`` where the process boundary is what is checked:
exit codes and stderr of a child process, --json on its stdout, stdin piped in, settings
from the environment, and workers started and stopped with signals."""
from __future__ import annotations

import base64
import json
import re

import pytest

from core.demo.models import PingRecord
from core.messages import Headers
from tests.cli_support import sluice_here
from tests.conftest import manage, put_raw_row, start_worker, wait_for


def sluice(*args: str, **kwargs):
    """A real ``manage.py sluice`` child process."""
    return manage("sluice", *args, **kwargs)


def ok(*args: str, **kwargs) -> str:
    """``sluice ARGS`` in this process; it must succeed.  Its stdout."""
    result = sluice_here(*args, **kwargs)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def ok_process(*args: str, **kwargs) -> str:
    """Like :func:`ok`, through a real ``manage.py`` child process."""
    result = sluice(*args, **kwargs)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_setup_is_idempotent(transactional_db):
    first = ok_process("setup")
    assert "error" in first and "demo" in first and "setup complete" in first
    second = ok("setup")
    assert "exists  error" in second


def test_queue_create_list_purge_delete(transactional_db):
    ok("setup")
    assert "created queue cli_orders" in ok("queue", "create", "cli_orders", "--ttl", "90")
    ok("send", "cli_orders", "--body", "one")
    ok("send", "cli_orders", "--body", "gone", "--ttl", "0")
    listing = json.loads(ok_process("queue", "list", "--json"))  # the real entry point's stdout
    row = next(r for r in listing if r["name"] == "cli_orders")
    assert row["pending"] == 1 and row["expired"] == 1 and row["ttl_seconds"] == 90
    assert {"name", "pending", "expired", "ttl_seconds"} <= set(row)
    assert "purged 1 expired" in ok("queue", "purge", "cli_orders", "--expired-only")
    assert "purged 1 message" in ok("queue", "purge", "cli_orders")
    assert "deleted queue cli_orders" in ok("queue", "delete", "cli_orders")
    assert all(r["name"] != "cli_orders" for r in json.loads(ok("queue", "list", "--json")))


def test_queue_create_options(transactional_db):
    ok("setup")
    ok("queue", "create", "cli_tmp", "--auto-delete-on-idle", "600", "--dead-letter-on-expiry")
    listing = {r["name"]: r for r in json.loads(ok("queue", "list", "--json"))}
    assert listing["cli_tmp"]["kind"] == "temporary"
    assert listing["cli_tmp"]["auto_delete_on_idle_seconds"] == 600
    assert listing["cli_tmp"]["dead_letter_on_expiry"] is True
    assert listing["cli_tmp.deadletter"]["kind"] == "dead_letter"
    ok("queue", "delete", "cli_tmp")
    ok("queue", "delete", "cli_tmp.deadletter")


def test_send_peek_receive_json(transactional_db, tmp_path):
    ok("setup")
    ok("queue", "create", "cli_msgs")
    first = ok("send", "cli_msgs", "--body", '{"a": 1}', "--type", "Ping", "--header", "K=V",
               "--header", "Empty=", "--message-id", "order-1").strip()
    assert first == "order-1"
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\x00\xffbinary")
    second = ok("send", "cli_msgs", "--body-file", str(blob), "--ttl", "3600").strip()

    peeked = json.loads(ok("peek", "cli_msgs", "--json"))
    assert [m["id"] for m in peeked] == ["order-1", second]  # FIFO
    text, binary = peeked
    assert text["type"] == "Ping" and text["body"] == '{"a": 1}' and text["expires"] is None
    assert text["headers"]["K"] == "V" and text["headers"]["Empty"] == ""
    assert binary["body"] is None and base64.b64decode(binary["body_base64"]) == b"\x00\xffbinary"
    assert binary["expires"].endswith("+00:00")
    assert json.loads(ok("peek", "cli_msgs", "--limit", "1", "--json"))[0]["id"] == "order-1"

    got = json.loads(ok("receive", "cli_msgs", "--json"))
    assert got["id"] == "order-1" and got["headers"][Headers.MESSAGE_ID] == "order-1"
    assert json.loads(ok("receive", "cli_msgs", "--json"))["id"] == second
    assert json.loads(ok("receive", "cli_msgs", "--json")) is None
    ok("queue", "delete", "cli_msgs")


def test_body_from_stdin(transactional_db):
    ok("setup")
    # A real pipe into a real process, and its --json.
    message_id = ok_process("send", "demo", "--type", "Nothing", "--body-file", "-", input=b"piped").strip()
    peeked = json.loads(ok_process("peek", "demo", "--json"))
    assert any(m["id"] == message_id and m["body"] == "piped" for m in peeked)
    ok("queue", "purge", "demo")


def test_receive_skips_expired_messages(transactional_db):
    ok("setup")
    ok("queue", "create", "cli_exp")
    ok("send", "cli_exp", "--body", "old", "--ttl", "0")
    ok("send", "cli_exp", "--body", "new")
    assert json.loads(ok("receive", "cli_exp", "--json"))["body"] == "new"
    ok("queue", "delete", "cli_exp")


def test_receive_moves_a_poison_row_to_the_error_queue_and_returns_the_next_message(transactional_db):
    from core.conf import get_settings
    from core.transport import Transport

    ok("setup")
    ok("queue", "create", "cli_poison")
    poison_id = put_raw_row("cli_poison", "{not json", b"raw")  # another system's row: header text nobody can read
    ok("send", "cli_poison", "--body", "after")
    assert json.loads(ok("receive", "cli_poison", "--json"))["body"] == "after"
    assert json.loads(ok("receive", "cli_poison", "--json")) is None
    [poison] = [m for m in Transport().browse(get_settings().ERROR_QUEUE, limit=10_000) if m.id == poison_id]
    assert poison.body == b"raw" and poison.headers[Headers.EXCEPTION_TYPE] == "core.errors.PoisonMessage"
    ok("queue", "delete", "cli_poison")


#: Cases that also run as a real child process (its exit code, stderr and stdout); every case
#: runs in this process, through the same command and error handling, except the worker's: a
#: worker runs in a process of its own.
IN_A_PROCESS = {("send", "nosuch", "--body", "x"), ("queue", "create", "bad;name"), ("worker", "--queue", "nosuch")}
ONLY_IN_A_PROCESS = {("worker", "--queue", "nosuch")}


@pytest.mark.parametrize("args, message", [
    (["send", "nosuch", "--body", "x"], "does not exist"),
    (["send", "demo", "--ttl", "-3"], "must not be negative"),
    (["send", "demo", "--ttl", "soon"], "number of seconds"),
    (["send", "demo", "--header", "novalue"], "KEY=VALUE"),
    (["send", "demo", "--body-file", "/nonexistent/file"], "cannot read"),
    (["queue", "create", "bad;name"], "may contain only"),
    (["queue", "create", "x" * 61], "at most 60"),
    (["queue", "create", "q1", "--ttl", "abc"], "number of seconds"),
    (["queue", "create", "q2", "--auto-delete-on-idle", "10"], "at least 300"),
    (["queue", "delete", "nosuch"], "does not exist"),
    (["peek", "nosuch"], "does not exist"),
    (["peek", "demo", "--limit", "0"], "at least 1"),
    (["receive", "it'sbad"], "may contain only"),
    (["worker", "--queue", "nosuch"], "does not exist"),
])
def test_bad_input_gives_a_clear_error_and_nonzero_exit(transactional_db, args, message):
    ok("setup")
    results = [] if tuple(args) in ONLY_IN_A_PROCESS else [sluice_here(*args)]
    if tuple(args) in IN_A_PROCESS:
        results.append(sluice(*args))
    for result in results:
        assert result.returncode != 0
        err = result.stderr.decode()
        assert message in err and "Traceback" not in err
        assert result.stdout.decode() == ""


def test_body_too_large(transactional_db):
    ok("setup")
    result = sluice("send", "demo", "--body", "x" * 2000, env={"SLUICE_MAX_BODY_BYTES": "1000"})
    assert result.returncode != 0 and "SLUICE_MAX_BODY_BYTES" in result.stderr.decode()


def test_worker_processes_demo_traffic_and_stops_cleanly(demo):
    import signal

    ids = [ok("send", "demo", "--type", "Ping", "--body", "{}").strip() for _ in range(5)]
    worker = start_worker("--queue", "demo")
    try:
        wait_for(lambda: PingRecord.objects.count() == 5, what="5 pings handled")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(ids)
    # Its summary on the way out.  (On a busy machine a Ping may fail once on SQLite's
    # write lock and be received again: handled is the count that must be 5.)
    assert re.search(r"demo: received \d+, handled 5, ", "".join(worker.output))


def test_worker_demo_traffic_flag_sends_to_the_demo_queue(demo):
    import signal

    worker = start_worker("--queue", "demo", "--demo-traffic", env={"SLUICE_DEMO_RATE": "20"})
    try:
        wait_for(lambda: PingRecord.objects.count() >= 3, what="demo pings handled")
    finally:
        worker.send_signal(signal.SIGINT)
        assert worker.wait(30) == 0


def test_failed_messages_cli(demo):
    env = {"SLUICE_DELAYED_RETRIES": "0", "SLUICE_IMMEDIATE_RETRIES": "0"}
    ids = [ok("send", "demo", "--type", "Fail").strip() for _ in range(2)]
    assert sluice("worker", "--queue", "demo", "--until-empty", "--no-mover", env=env).returncode == 0
    assert "ingested 2" in ok("failed", "ingest")
    [group] = json.loads(ok("failed", "groups", "--json"))
    assert group["count"] == 2 and group["exception_type"] == "ValueError" and "fail" in group["title"]
    listed = json.loads(ok("failed", "list", "--json"))
    assert sorted(r["message_id"] for r in listed) == sorted(ids)
    assert {r["status"] for r in listed} == {"unresolved"} and {r["queue"] for r in listed} == {"demo"}
    result = sluice("failed", "retry", "--group", group["group"])
    assert result.returncode == 0 and "2 done, 0 failed of 2" in result.stdout.decode()
    assert "2/2" in result.stderr.decode()  # the progress bar
    assert {r["status"] for r in json.loads(ok("failed", "list", "--json"))} == {"retry_pending"}
    assert len(json.loads(ok("peek", "demo", "--json"))) == 2
    bad = sluice_here("failed", "retry")
    assert bad.returncode != 0 and "name ids" in bad.stderr.decode()
