"""Phase 2 of the outbox without locks held over the network (issue 11, defect 3) and
outbox delays counted by the database clock (defect 8)."""
from __future__ import annotations

import datetime
import threading
import time

from django.db import connections

from core.delayed import delayed_store
from core.outbox import Outbox, OutboxSession, OutboxStore, register_destination
from core.transport import Transport


def _dispatch_in_another_thread(message_id: str) -> dict:
    """What a second dispatcher (another process, say) gets for ``message_id`` right now."""
    result: dict = {}

    def run() -> None:
        try:
            result["report"] = Outbox().dispatch([message_id])
        except Exception as exc:  # noqa: BLE001 - reported to the test
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return result


def test_phase_two_publishes_outside_any_transaction_and_a_second_dispatcher_skips_the_claim(outbox):
    seen: list = []

    def publish(op):
        # No transaction (so no row lock, and on SQLite no database write lock) is open
        # while the message leaves the database ...
        seen.append(connections[outbox.using].in_atomic_block)
        # ... and the claim is a lease: another dispatcher neither waits nor publishes it again.
        seen.append(_dispatch_in_another_thread(op["ref"]))

    register_destination("test-lease", publish)
    with OutboxSession(message_id="lease-1") as session:
        session.add("test-lease", {"ref": "lease-1"})
    assert len(seen) == 2, "published exactly once"
    in_transaction, other = seen
    assert in_transaction is False
    assert "error" not in other, other.get("error")
    assert other["report"].dispatched == [] and other["report"].failed == {}
    assert outbox.store.record("lease-1").dispatched


def test_a_crash_between_publish_and_mark_republishes_the_same_operation_after_the_lease(outbox, monkeypatch):
    published: list[str] = []
    register_destination("test-crash", lambda op: published.append(op["task_id"]))
    real_mark = OutboxStore.mark_dispatched
    crashes = []

    def crash_once(self, ids, token):
        if not crashes:
            crashes.append(ids)
            raise RuntimeError("the process died before marking the record dispatched")
        return real_mark(self, ids, token)

    monkeypatch.setattr(OutboxStore, "mark_dispatched", crash_once)
    box = Outbox()
    box.dispatch_lease = 1.0
    monkeypatch.setattr(Outbox, "after_commit", lambda self, ids: None)
    with OutboxSession(message_id="crash-1", outbox=box) as session:
        session.add("test-crash", {"task_id": "task-1"})
    try:
        box.dispatch(["crash-1"])
    except RuntimeError:
        pass
    assert published == ["task-1"] and crashes
    # While the lease runs nobody publishes it again (the first dispatcher may be alive).
    assert box.dispatch(["crash-1"]).dispatched == [] and published == ["task-1"]
    deadline = time.monotonic() + 10
    while not box.dispatch(["crash-1"]).dispatched:
        assert time.monotonic() < deadline, "the lapsed lease was never taken over"
        time.sleep(0.1)
    # Re-published with the same id: the receiver's idempotency key absorbs it.
    assert published == ["task-1", "task-1"]
    assert box.store.record("crash-1").dispatched


def test_an_outbox_delay_is_counted_by_the_database_clock(outbox, queue, monkeypatch):
    store = delayed_store()
    store.setup_infrastructure()
    real = datetime.datetime

    class AnHourAhead(real):
        """The application server's clock runs an hour fast; the database's is right."""

        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + datetime.timedelta(hours=1)

    # Skewed for the send and for the dispatch on commit: neither may count with it.
    with monkeypatch.context() as patch:
        patch.setattr(datetime, "datetime", AnHourAhead)
        with OutboxSession() as session:
            message_id = session.send(queue, "later", delay=60)
    try:
        assert Transport().counts(queue).total == 0  # in the delayed store
        stored, db_now = store.list()
        mine = [m for m in stored if m.id == message_id]
        assert len(mine) == 1
        ahead = (mine[0].due - db_now).total_seconds()
        assert 50 < ahead <= 60, f"due {ahead:.1f} s after the database's now, not 60 s"
    finally:
        # Its queue is dropped after the test: a mover in a later test would find it due
        # and, with nowhere to go, put it in the error queue.
        store.delete(message_id)


def test_an_outbox_table_made_before_the_lease_gets_its_column_from_setup(outbox, queue):
    from core.outbox import create_outbox_table

    store = outbox.store
    d = store.dialect

    def lease_columns() -> list[str]:
        present = []
        with connections[store.using].cursor() as cursor:
            for column in d.LEASE_COLUMNS:
                cursor.execute(*d.outbox_column_exists(store.table, column))
                if cursor.fetchone() is not None:
                    present.append(column)
        return present

    with connections[store.using].cursor() as cursor:
        for column in d.LEASE_COLUMNS:
            cursor.execute(f"ALTER TABLE {d.table(store.table)} DROP COLUMN {d.quote(column)}")
    assert lease_columns() == []
    assert create_outbox_table() == (store.table, False)
    assert lease_columns() == ["DispatchingUntil", "DispatchToken"]
    with OutboxSession() as session:
        session.send(queue, "after the upgrade")
    assert Transport().counts(queue).total == 1 and outbox.store.stats().undispatched == 0


# -- issue 18, defect 3: a lease that runs out while publishing ------------------------------

def _count_by_body(queue: str) -> dict[str, int]:
    """How many rows of each body ``queue`` holds (the outbox's local operations)."""
    bodies: dict[str, int] = {}
    for message in Transport().browse(queue, 1000):
        key = message.body.decode().strip('"')
        bodies[key] = bodies.get(key, 0) + 1
    return bodies


def _record_with_a_local_and_an_external_operation(box, queue: str, ref: str, kind: str) -> None:
    with OutboxSession(message_id=ref, outbox=box) as session:
        session.send(queue, ref)  # local: inserted with the mark, exactly once
        session.add(kind, {"ref": ref})  # external: published before the mark


def test_a_dispatcher_whose_lease_ran_out_while_publishing_leaves_the_record_to_its_successor(
        outbox, queue, monkeypatch, caplog):
    """A slow destination: the publish blocks until the lease is over and a second
    dispatcher has taken the record, published it and marked it.  The first one's mark is
    then a compare-and-set that finds the record no longer its own: it inserts nothing,
    marks nothing, and says so."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)  # dispatch by hand
    box = type(outbox)()
    box.dispatch_lease = 1.0
    published: list[str] = []
    second: dict = {}

    def slow(op):
        published.append(op["ref"])
        if len(published) == 1:  # the first dispatcher: outlive the lease, let the second run
            time.sleep(box.dispatch_lease + 0.3)
            second.update(_dispatch_in_another_thread(op["ref"]))

    register_destination("test-slow", slow)
    _record_with_a_local_and_an_external_operation(box, queue, "slow-1", "test-slow")
    first = box.dispatch(["slow-1"])
    assert "error" not in second, second.get("error")
    assert second["report"].dispatched == ["slow-1"], "the second dispatcher took the lapsed lease"
    assert _count_by_body(queue) == {"slow-1": 1}, "the local operation happened exactly once"
    assert published == ["slow-1", "slow-1"]  # external: at least once (same ids both times)
    assert first.dispatched == [] and first.lost == ["slow-1"] and first.failed == {}
    assert ("outbox: lost the lease of 1 record(s) to another dispatcher (this one's ran out before it marked "
            "them): slow-1; their local operations are left to it (operations already published elsewhere go "
            "out again with the same ids)") in _warnings(caplog)
    record = box.store.record("slow-1")
    assert record.dispatched and record.last_error is None


def test_a_dispatcher_that_lost_its_lease_neither_marks_nor_fails_nor_frees_its_successors_claim(
        outbox, queue, monkeypatch):
    """The lease is the token's: dispatcher A's lease ran out while it published, B claimed
    the record and is still publishing.  A then finishing (its mark) or failing (its error)
    changes nothing: neither marks the record under B, nor records A's error, nor ends B's
    lease — which would let a third dispatcher publish the external operations again while
    B still is.  B's mark is the one that counts."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)  # dispatch by hand
    store = outbox.store
    register_destination("test-noop", lambda op: None)
    _record_with_a_local_and_an_external_operation(outbox, queue, "taken-1", "test-noop")
    assert [r.message_id for r in store.claim(["taken-1"], 0.2, "token-a")] == ["taken-1"]
    time.sleep(0.4)  # A's lease runs out
    assert [r.message_id for r in store.claim(["taken-1"], 30.0, "token-b")] == ["taken-1"]

    assert store.fail("taken-1", "A's destination failed", "token-a") is False
    assert store.claim(["taken-1"], 30.0, "token-c") == []  # still B's: no third publication
    assert store.mark_dispatched(["taken-1"], "token-a") == set()
    record = store.record("taken-1")
    assert not record.dispatched and record.last_error is None

    assert store.mark_dispatched(["taken-1"], "token-b") == {"taken-1"}
    assert store.record("taken-1").dispatched


def test_two_dispatchers_at_once_under_a_slow_destination_do_every_local_operation_once(
        outbox, queue, monkeypatch, caplog):
    """Two dispatchers race over the same records while publishing takes longer than the
    lease: whatever the interleaving, each record's local message exists exactly once and
    every record ends dispatched.  One that sees its lease running out stops publishing
    (and marks what it published in time), so the two cannot keep taking the chunk from
    each other."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    box = type(outbox)()
    box.dispatch_lease = 0.5
    refs = [f"race-{i}" for i in range(12)]
    register_destination("test-crawl", lambda op: time.sleep(0.12))
    for ref in refs:
        _record_with_a_local_and_an_external_operation(box, queue, ref, "test-crawl")

    reports: list = []
    errors: list = []

    def dispatcher() -> None:
        other = type(outbox)()
        other.dispatch_lease = box.dispatch_lease
        try:
            deadline = time.monotonic() + 30
            while box.store.stats().undispatched and time.monotonic() < deadline:
                reports.append(other.dispatch(refs))
                time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=dispatcher) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert _count_by_body(queue) == {ref: 1 for ref in refs}
    assert box.store.stats().undispatched == 0
    dispatched = [mid for report in reports for mid in report.dispatched]
    assert sorted(dispatched) == sorted(refs), "each record marked by exactly one dispatcher"
    assert "would run out while publishing; stopped" in caplog.text


# -- what a dispatcher reports and logs: failures, a lapsed lease, a chunk published whole --

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sluice.outbox" and r.levelname == "WARNING"]


def test_a_destination_that_fails_keeps_its_record_and_error_and_the_rest_of_the_chunk_goes_out(
        outbox, queue, monkeypatch, caplog):
    """One chunk: a record whose destination raises, one whose destination works, one with
    only a local operation.  The failing record stays undispatched with its error, its
    lease ended (the next dispatch takes it at once); the other two are dispatched."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)  # dispatch by hand
    down = [True]

    def flaky(op):
        if down[0] and op["ref"] == "bad-1":
            raise ConnectionError("broker down")

    register_destination("test-flaky", flaky)
    _record_with_a_local_and_an_external_operation(outbox, queue, "ok-1", "test-flaky")
    _record_with_a_local_and_an_external_operation(outbox, queue, "bad-1", "test-flaky")
    with OutboxSession(message_id="local-1") as session:
        session.send(queue, "local-1")  # nothing to publish: marked with the others

    report = outbox.dispatch(["ok-1", "bad-1", "local-1"])
    assert sorted(report.dispatched) == ["local-1", "ok-1"]
    assert report.failed == {"bad-1": "ConnectionError: broker down"} and report.lost == []
    assert _warnings(caplog) == ["outbox record bad-1 not dispatched (will retry): ConnectionError: broker down"]
    assert _count_by_body(queue) == {"ok-1": 1, "local-1": 1}
    record = outbox.store.record("bad-1")
    assert not record.dispatched and record.last_error == "ConnectionError: broker down"

    down[0] = False  # the broker is back: its lease ended with the failure, so no wait
    assert outbox.dispatch(["bad-1"]).dispatched == ["bad-1"]
    assert _count_by_body(queue) == {"ok-1": 1, "local-1": 1, "bad-1": 1}


def test_a_local_operation_that_fails_at_the_mark_names_its_error(outbox, queue, make_queue, monkeypatch):
    from core.queues import delete_queue

    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    gone = make_queue()
    with OutboxSession(message_id="to-gone") as session:
        session.send(gone, "x")
    delete_queue(gone)
    report = outbox.dispatch(["to-gone"])
    error = report.failed["to-gone"]
    assert error.startswith("UnknownQueue: ") and gone in error
    assert outbox.store.record("to-gone").last_error == error


def test_a_fast_destination_is_published_whole_within_one_lease(outbox, queue, monkeypatch):
    # A short lease (the publishing stops only when the slowest publish so far would not fit).
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    box = type(outbox)()
    box.dispatch_lease = 1.0
    register_destination("test-fast", lambda op: None)
    refs = [f"fast-{i}" for i in range(5)]
    for ref in refs:
        _record_with_a_local_and_an_external_operation(box, queue, ref, "test-fast")
    report = box.dispatch(refs)
    assert sorted(report.dispatched) == refs and report.lost == [] and report.failed == {}


def test_a_dispatcher_stops_publishing_when_the_next_record_would_outlast_its_lease(
        outbox, queue, monkeypatch, caplog):
    """Each publish takes 1.6 s of a 3 s lease: after the first, the second would end past
    the lease (with the mark's margin), so the dispatcher marks the first and leaves the
    rest, named in one WARNING, to the next dispatcher."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    box = type(outbox)()
    box.dispatch_lease = 3.0
    published: list[str] = []

    def slow(op):
        published.append(op["ref"])
        time.sleep(1.6)

    register_destination("test-slowish", slow)
    refs = ["slowish-1", "slowish-2", "slowish-3"]
    for ref in refs:
        _record_with_a_local_and_an_external_operation(box, queue, ref, "test-slowish")
    report = box.dispatch(refs)
    assert report.dispatched == ["slowish-1"] and report.lost == ["slowish-2", "slowish-3"]
    assert published == ["slowish-1"]
    assert _warnings(caplog) == [
        "outbox: the 3 s dispatch lease would run out while publishing; stopped, leaving 2 record(s) to the "
        "next dispatcher: slowish-2, slowish-3"]


def test_a_failure_after_the_lease_was_taken_over_is_left_to_the_new_holder(outbox, queue, monkeypatch, caplog):
    """The destination fails only after the lease ran out and another dispatcher claimed
    the record: the first records no error and does not end the other's lease."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    box = type(outbox)()
    box.dispatch_lease = 0.3

    def taken_then_failing(op):
        time.sleep(0.5)  # the lease runs out; another dispatcher claims the record
        assert [r.message_id for r in box.store.claim([op["ref"]], 30.0, "another")] == [op["ref"]]
        raise RuntimeError("too late")

    register_destination("test-late", taken_then_failing)
    _record_with_a_local_and_an_external_operation(box, queue, "late-1", "test-late")
    report = box.dispatch(["late-1"])
    assert report.failed == {} and report.dispatched == [] and report.lost == ["late-1"]
    assert _warnings(caplog)[0] == ("outbox record late-1 failed to dispatch (RuntimeError: too late) after "
                                    "another dispatcher took over its lease; left to that dispatcher")
    record = box.store.record("late-1")
    assert not record.dispatched and record.last_error is None
    assert box.store.claim(["late-1"], 30.0, "a third") == []  # still the other's


def test_a_dispatch_of_more_than_a_chunk_dispatches_every_chunk(outbox, queue, monkeypatch):
    from core.outbox.dispatch import DISPATCH_CHUNK

    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    refs = [f"many-{i}" for i in range(DISPATCH_CHUNK + 20)]
    for ref in refs:
        with OutboxSession(message_id=ref) as session:
            session.send(queue, ref)  # local only: each chunk claimed, inserted and marked at once
    assert sorted(outbox.dispatch(refs).dispatched) == sorted(refs)
    assert Transport().counts(queue).total == len(refs)


def test_a_quarantined_record_is_dispatched_again_only_when_asked(outbox, queue, monkeypatch, caplog):
    """A record whose operations cannot be read is quarantined with one ERROR, and the rest
    of its chunk goes on.  `sluice outbox dispatch ID` asks (include_quarantined): an operator
    who repaired the record sends it on; a scan never picks it up by itself."""
    monkeypatch.setattr(type(outbox), "after_commit", lambda self, ids: None)
    for ref in ("repaired", "alongside"):
        with OutboxSession(message_id=ref) as session:
            session.send(queue, ref)
    d = outbox.store.dialect
    table, column, key = d.table(outbox.store.table), d.quote("Operations"), d.quote("MessageId")
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE {key} = %s", ["repaired"])
        (good,) = cursor.fetchone()
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {key} = %s", ['{"v": 1, "ops": [{', "repaired"])
    report = outbox.dispatch(["repaired", "alongside"])
    assert report.quarantined == ["repaired"] and report.dispatched == ["alongside"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("outbox record repaired quarantined: Operations is not valid JSON")
    with connections["default"].cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {key} = %s", [good, "repaired"])  # the repair
    assert outbox.dispatch(["repaired"]).dispatched == []
    assert outbox.dispatch(["repaired"], include_quarantined=True).dispatched == ["repaired"]
    assert _count_by_body(queue) == {"repaired": 1, "alongside": 1}
