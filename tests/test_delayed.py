"""Delayed delivery: the store interface, sending later, the mover, delayed retries."""
from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest
from django.db import connection, transaction

from core.conf import get_settings
from core.delayed import DelayedMessage, DelayedMover, SqlDelayedStore, delayed_store
from core.errors import InvalidMessage
from core.runtime.loops import ThreadRunner
from core.messages import Headers, parse_wire_time
from core.models import Lease as LeaseRecord
from core.receive.pump import MessagePump
from tests.conftest import manage, wait_for

UTC = dt.timezone.utc


@pytest.fixture
def store(transactional_db) -> SqlDelayedStore:
    """The endpoint's SQL store, created and emptied."""
    s = SqlDelayedStore()
    s.setup_infrastructure()
    empty(s)
    yield s
    empty(s)


def empty(store: SqlDelayedStore) -> None:
    for message in store.list(100_000)[0]:
        store.delete(message.id)


@pytest.fixture
def mover(store, error_queue):
    movers = []

    def make(**options):
        options.setdefault("max_sleep", 0.5)
        m = DelayedMover(store if "store" not in options else options.pop("store"), **options)
        movers.append(m)
        return m

    yield make
    for m in movers:
        m.close()


def in_the_store(store) -> list[DelayedMessage]:
    return store.list()[0]


# -- the store interface ---------------------------------------------------------------------

def test_store_interface(store):
    store.setup_infrastructure()  # idempotent
    assert store.next() is None
    soon = DelayedMessage(id="m1", destination="orders", body=b"x", headers={"A": "1"},
                          due=dt.datetime.now(UTC) - dt.timedelta(seconds=1))
    later = DelayedMessage(id="m2", destination="orders", body=b"y", headers={},
                           due=dt.datetime.now(UTC) + dt.timedelta(hours=1))
    store.store(later)
    store.store(soon)
    assert abs((store.next() - soon.due).total_seconds()) < 0.01
    with transaction.atomic():
        due = store.fetch_next_due(dt.datetime.now(UTC))
        assert (due.id, due.body, due.headers, due.retry_count) == ("m1", b"x", {"A": "1"}, 0)
        assert store.increment_failure_count(due) is True
        assert store.fetch_next_due(dt.datetime.now(UTC)).retry_count == 1
        assert store.remove(due) is True
        assert store.remove(due) is False
        assert store.increment_failure_count(due) is False
    assert store.fetch_next_due(dt.datetime.now(UTC)) is None  # m2 is not due yet
    assert [m.id for m in in_the_store(store)] == ["m2"]


def test_claiming_takes_due_messages_out_earliest_first_and_a_rollback_puts_them_back(store):
    """The mover's fast path: one statement deletes and returns what is due by the
    database's clock; the transaction that forwards them decides whether they are gone."""
    now = dt.datetime.now(UTC)
    for n, seconds in enumerate([-3, -1, -2, 3600]):
        store.store(DelayedMessage(id=f"m{n}", destination="orders", body=b"%d" % n, headers={"n": str(n)},
                                   due=now + dt.timedelta(seconds=seconds)))
    with transaction.atomic():
        claimed = store.claim_due(10)
        assert [(m.id, m.body, m.headers, m.retry_count) for m in claimed] == [
            ("m0", b"0", {"n": "0"}, 0), ("m2", b"2", {"n": "2"}, 0), ("m1", b"1", {"n": "1"}, 0)]
        assert [m.id for m in in_the_store(store)] == ["m3"]  # gone within the transaction
        transaction.set_rollback(True)
    assert sorted(m.id for m in in_the_store(store)) == ["m0", "m1", "m2", "m3"]
    with transaction.atomic():
        assert [m.id for m in store.claim_due(2)] == ["m0", "m2"]  # the limit takes the earliest
    assert sorted(m.id for m in in_the_store(store)) == ["m1", "m3"]


def test_a_claim_says_when_the_next_message_left_is_due_where_the_dialect_can(store):
    """On PostgreSQL the claim's statement also returns the earliest due time among the
    rows it did not take, and the database's now: the mover's next question, answered."""
    now = dt.datetime.now(UTC)
    for n, seconds in enumerate([-2, -1, 30, 60]):
        store.store(DelayedMessage(id=f"m{n}", destination="orders", body=b"", headers={},
                                   due=now + dt.timedelta(seconds=seconds)))
    can = store.dialect.supports_claim_with_next
    with transaction.atomic():
        claim = store.claim(1)
    assert [m.id for m in claim.messages] == ["m0"]
    if not can:
        assert (claim.next_due, claim.now) == (None, None)  # the mover asks after its commit
        return
    assert claim.next_due == store.list()[0][0].due  # m1: due, past the limit, still here
    assert abs((claim.now - dt.datetime.now(UTC)).total_seconds()) < 5
    with transaction.atomic():
        claim = store.claim(10)
    assert [m.id for m in claim.messages] == ["m1"]
    assert abs((claim.next_due - now - dt.timedelta(seconds=30)).total_seconds()) < 0.01  # m2
    with transaction.atomic():
        nothing = store.claim(10)
    assert nothing.messages == [] and nothing.next_due == claim.next_due  # one row of NULLs and the two
    for message in store.list()[0]:
        store.delete(message.id)
    with transaction.atomic():
        empty_store = store.claim(10)
    assert (empty_store.messages, empty_store.next_due) == ([], None) and empty_store.now is not None


def test_the_claims_next_due_time_is_read_from_the_time_index(store):
    """The claim's extra question must not read the store: with 20,000 messages waiting
    (a few due), the whole statement touches a few dozen pages, not the table's hundreds."""
    if not store.dialect.supports_claim_with_next:
        pytest.skip("the dialect asks the next due time in a statement of its own")
    from tests.test_receive_marks import buffers_read

    now = dt.datetime.now(UTC)
    store.store_many([DelayedMessage(id=f"w{n}", destination="orders", body=b"x" * 100, headers={"n": str(n)},
                                     due=now + dt.timedelta(seconds=-5 if n < 5 else 60 + n)) for n in range(20_000)])
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {store.dialect.table(store.table)}")
    d = store.dialect
    read = buffers_read(d.delayed_claim_due_and_next(store.table), d.delayed_claim_params(None, 10))
    assert read < 60, read


def test_storing_the_same_message_id_twice_keeps_the_first(store):
    first = DelayedMessage(id="dup", destination="a", body=b"1", headers={}, due=dt.datetime.now(UTC))
    store.store(first)
    store.store(DelayedMessage(id="dup", destination="b", body=b"2", headers={}, due=dt.datetime.now(UTC)))
    assert [(m.destination, m.body) for m in in_the_store(store)] == [("a", b"1")]


# -- sending later -------------------------------------------------------------------------------

def test_send_with_a_delay_goes_to_the_store_with_a_database_due_time(store, transport, queue):
    before = dt.datetime.now(UTC)
    message_id = transport.send(queue, "later", message_type="Ping", delay=30)
    assert transport.counts(queue).total == 0
    [stored] = in_the_store(store)
    assert stored.id == message_id and stored.destination == queue and stored.body == b"later"
    assert 29 < (stored.due - before).total_seconds() < 31
    assert stored.headers[Headers.DELIVER_AT].endswith(" Z")


def test_send_at_an_absolute_time(store, transport, queue):
    when = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    transport.send(queue, "x", deliver_at=when)
    assert in_the_store(store)[0].due == when
    transport.send(queue, "y", deliver_at="2032-01-01T00:00:00+02:00")
    assert in_the_store(store)[1].due == dt.datetime(2031, 12, 31, 22, 0, tzinfo=UTC)


@pytest.mark.parametrize("options", [{"delay": 0}, {"deliver_at": dt.datetime(2001, 1, 1, tzinfo=UTC)}])
def test_no_delay_or_a_past_time_sends_now(store, transport, queue, options):
    transport.send(queue, "now", **options)
    assert transport.counts(queue).total == 1 and in_the_store(store) == []


@pytest.mark.parametrize("options, error", [
    ({"deliver_at": dt.datetime(2031, 1, 1)}, "timezone-aware"),
    ({"deliver_at": "2031-01-01T00:00:00"}, "timezone-aware"),
    ({"deliver_at": "next tuesday"}, "ISO 8601"),
    ({"deliver_at": dt.datetime(9000, 1, 1, tzinfo=UTC)}, "100 years"),
    ({"delay": 10 ** 10}, "100 years"),
    ({"delay": -1}, "0 or more"),
    ({"delay": "soon"}, "number of seconds"),
    ({"delay": 5, "deliver_at": dt.datetime(2031, 1, 1, tzinfo=UTC)}, "not both"),
])
def test_bad_delays_are_refused_and_nothing_is_stored(store, transport, queue, options, error):
    with pytest.raises(InvalidMessage, match=error):
        transport.send(queue, "x", **options)
    assert in_the_store(store) == [] and transport.counts(queue).total == 0


# -- the mover ---------------------------------------------------------------------------------

def test_mover_forwards_due_messages_and_leaves_the_rest(store, transport, queue, mover):
    transport.send(queue, "due", delay=0.05)
    transport.send(queue, "later", delay=3600)
    time.sleep(0.1)
    m = mover()
    wait = m.step()
    assert [x.body for x in transport.browse(queue)] == [b"due"]
    assert [x.body for x in in_the_store(store)] == [b"later"]
    assert 0 < wait <= 0.5  # sleeps until the next due time, capped


def test_a_mover_that_moved_a_few_sleeps_until_the_next_due_one(store, transport, queue, mover, monkeypatch):
    """After a step that moved fewer than a batch, the wait runs to the next message's due
    time by the database's clock, however long the forwarding took; on PostgreSQL the
    claim said when that is, and nothing is asked after the commit."""
    transport.send(queue, "due", delay=0.05)
    transport.send(queue, "in two seconds", delay=2)
    time.sleep(0.1)
    m = mover(max_sleep=30)
    m._poll = None  # (SQLite's poll would cut the wait short)
    asked = []
    next_and_now = store.next_and_now
    monkeypatch.setattr(store, "next_and_now", lambda: asked.append(1) or next_and_now())
    wait = m.step()
    assert [x.body for x in transport.browse(queue)] == [b"due"]
    assert 1.5 < wait < 2.0
    assert len(asked) == (0 if store.dialect.supports_claim_with_next else 1)
    wait = m.step()  # nothing due: the claim of nothing says the same
    assert 1.4 < wait < 2.0 and transport.counts(queue).total == 1


def test_ttl_starts_when_the_message_lands(store, transport, queue, mover):
    transport.send(queue, "x", delay=0.3, ttl=5)
    time.sleep(0.35)
    mover().step()
    [landed] = transport.browse(queue)
    delivered = parse_wire_time(landed.headers[Headers.DELIVERED_AT])
    assert abs((landed.expires - delivered).total_seconds() - 5) < 0.5
    assert not landed.expired


def test_a_store_wakes_a_sleeping_mover(store, transport, queue, mover):
    m = mover(max_sleep=30, elect=False)  # (an elected mover also wakes to renew its lease)
    if m._listener is not None:
        assert m._listener.connected.wait(10)  # (while it is down the mover polls instead)
    m._poll = None  # no polling: only a wake-up can end its 30 s sleep
    with ThreadRunner([m]):
        wait_for(lambda: m._sleep_until - time.time() > 20, timeout=5, what="the mover asleep")
        transport.send(queue, "x", delay=0.2)
        # Within 5 s only if the store woke it (otherwise it sleeps 30 s).
        wait_for(lambda: transport.counts(queue).total == 1, timeout=5, what="delivery")


def test_a_missing_destination_goes_to_the_error_queue_with_a_reason(store, transport, mover, error_queue):
    store.store(DelayedMessage(id="lost", destination="no_such_queue", body=b"x", headers={},
                               due=dt.datetime.now(UTC)))
    mover().step()
    [failed] = transport.browse(error_queue)
    assert failed.headers[Headers.EXCEPTION_TYPE] == "core.errors.UnknownQueue"
    assert "no_such_queue" in failed.headers[Headers.EXCEPTION_MESSAGE]
    assert failed.headers[Headers.FAILED_Q] == store.table
    assert in_the_store(store) == []


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_forwarding_retries_boundary_is_exact(store, transport, mover, error_queue, retries):
    """With N retries a message is forwarded at most N + 1 times, then goes to the error queue."""
    store.store(DelayedMessage(id="flaky", destination="no_such_queue", body=b"x", headers={},
                               due=dt.datetime.now(UTC)))
    m = mover(number_of_retries=retries)
    for attempt in range(1, retries + 2):
        assert transport.counts(error_queue).total == 0, f"in the error queue before attempt {attempt}"
        m.move_due()
    assert m.failed == retries + 1
    assert transport.counts(error_queue).total == 1
    assert transport.browse(error_queue)[0].headers[Headers.FAILED_ATTEMPTS] == str(retries + 1)
    assert in_the_store(store) == []


def test_one_bad_message_does_not_block_or_duplicate_the_batch(store, transport, queue, mover, error_queue):
    now = dt.datetime.now(UTC)
    for i in range(5):
        store.store(DelayedMessage(id=f"ok{i}", destination=queue, body=str(i).encode(), headers={}, due=now))
    store.store(DelayedMessage(id="bad", destination="gone", body=b"", headers={}, due=now))
    mover().move_due()
    assert sorted(m.body for m in transport.browse(queue)) == [b"0", b"1", b"2", b"3", b"4"]
    assert transport.counts(error_queue).total == 1 and in_the_store(store) == []


def test_two_movers_elect_one_and_deliver_each_message_once(store, transport, queue, mover):
    first, second = mover(), mover()
    now = dt.datetime.now(UTC)
    for i in range(30):
        store.store(DelayedMessage(id=f"e{i}", destination=queue, body=b"", headers={}, due=now))
    first.step()
    second.step()
    assert first.moved == 30 and second.moved == 0
    assert LeaseRecord.objects.get(name=first.lease.name).holder == first.lease.holder
    first.close()  # a graceful stop hands the lease over at once
    store.store(DelayedMessage(id="after", destination=queue, body=b"", headers={}, due=now))
    second.step()
    assert second.moved == 1 and transport.counts(queue).total == 31


# -- delayed retries (recoverability) ------------------------------------------------------------

def test_delayed_retries_then_the_error_queue(store, transport, queue, temp_handlers, error_queue, settings):
    settings.SLUICE_DELAYED_RETRY_INCREASE = 0.2
    attempts = []

    def always_fails(message, context):
        attempts.append((context.attempt, message.delayed_retries))
        raise ValueError("broken")

    temp_handlers(queue, None, always_fails)
    transport.send(queue, "x")
    pump = MessagePump(queue, peek_delay=0.1, immediate_retries=1, delayed_retries=2)
    m = DelayedMover(store, max_sleep=0.2)
    with ThreadRunner([pump, m]):
        wait_for(lambda: transport.counts(error_queue).total == 1, timeout=20, what="error queue")
    # Two rounds of (1 + 1 immediate) after the first round: 6 attempts, counted in the headers.
    assert attempts == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2), (6, 2)]
    failed = transport.browse(error_queue)[0]
    assert failed.headers[Headers.DELAYED_RETRIES] == "2"
    assert failed.headers[Headers.TOTAL_FAILED_ATTEMPTS] == "6"
    assert failed.headers[Headers.FAILED_Q] == queue


def test_a_delayed_retry_waits_in_the_store(store, transport, queue, temp_handlers, settings):
    temp_handlers(queue, None, lambda m, c: 1 / 0)
    transport.send(queue, "x")
    pump = MessagePump(queue, peek_delay=0.1, immediate_retries=0, delayed_retries=3)
    try:
        pump.receive_and_process(1)
    finally:
        pump.close()
    [waiting] = in_the_store(store)
    assert waiting.destination == queue and waiting.headers[Headers.DELAYED_RETRIES] == "1"
    assert waiting.headers[Headers.FAILED_ATTEMPTS] == "0"  # a fresh round of immediate retries
    assert transport.counts(queue).total == 0


# -- a store of your own ---------------------------------------------------------------------------

class MemoryStore:
    """A user-written store: only the interface, kept in memory (at-least-once)."""

    instances: list["MemoryStore"] = []

    def __init__(self, using=None):
        self.messages: dict[str, DelayedMessage] = {}
        self.locked: set[str] = set()
        self.lock = threading.Lock()
        MemoryStore.instances.append(self)

    def setup_infrastructure(self):
        pass

    def store(self, message, delay=None):
        if delay is not None:
            message.due = dt.datetime.now(UTC) + dt.timedelta(seconds=delay)
        with self.lock:
            self.messages.setdefault(message.id, message)

    def remove(self, message):
        with self.lock:
            self.locked.discard(message.id)
            return self.messages.pop(message.id, None) is not None

    def increment_failure_count(self, message):
        with self.lock:
            self.locked.discard(message.id)
            if message.id not in self.messages:
                return False
            self.messages[message.id].retry_count += 1
            return True

    def next(self):
        with self.lock:
            return min((m.due for m in self.messages.values()), default=None)

    def fetch_next_due(self, at):
        with self.lock:
            due = sorted((m for m in self.messages.values() if m.due <= at and m.id not in self.locked),
                         key=lambda m: m.due)
            if not due:
                return None
            self.locked.add(due[0].id)
            return due[0]


def test_a_user_written_store_plugs_in(transport, queue, settings, error_queue):
    settings.SLUICE_DELAYED_STORE = "tests.test_delayed.MemoryStore"
    message_id = transport.send(queue, "kept in memory", delay=0.1)
    store = MemoryStore.instances[-1]
    assert list(store.messages) == [message_id]
    time.sleep(0.15)
    m = DelayedMover(store, max_sleep=0.2)
    try:
        m.step()
    finally:
        m.close()
    assert [x.body for x in transport.browse(queue)] == [b"kept in memory"]
    assert store.messages == {}
    assert isinstance(delayed_store(), MemoryStore)


# -- the command line ------------------------------------------------------------------------

def test_delayed_cli(store):
    assert manage("sluice", "setup").returncode == 0
    r = manage("sluice", "send", "demo", "--type", "Ping", "--delay", "3600")
    assert r.returncode == 0, r.stderr.decode()
    first = r.stdout.decode().strip()
    second = manage("sluice", "send", "demo", "--deliver-at", "2031-01-01T00:00:00Z").stdout.decode().strip()
    listing = json.loads(manage("sluice", "delayed", "list", "--json").stdout)
    assert [row["id"] for row in listing] == [first, second]  # by due time
    assert listing[1]["due"] == "2031-01-01T00:00:00+00:00"
    assert {"id", "destination", "due", "retry_count"} <= set(listing[0])
    assert listing[0]["destination"] == "demo" and listing[0]["retry_count"] == 0
    assert listing[0]["state"] == "scheduled"
    assert manage("sluice", "delayed", "deliver-now", first).returncode == 0
    assert json.loads(manage("sluice", "delayed", "list", "--json").stdout)[0]["state"] == "due"
    assert manage("sluice", "delayed", "delete", second).returncode == 0
    missing = manage("sluice", "delayed", "delete", second)
    assert missing.returncode != 0 and "no delayed message" in missing.stderr.decode()
    bad = manage("sluice", "send", "demo", "--deliver-at", "2031-01-01T00:00:00")
    assert bad.returncode != 0 and "timezone-aware" in bad.stderr.decode()
    both = manage("sluice", "send", "demo", "--delay", "1", "--deliver-at", "2031-01-01T00:00:00Z")
    assert both.returncode != 0
    manage("sluice", "delayed", "delete", first)


def test_failures_log_at_the_levels_nservicebus_uses(store, transport, queue, temp_handlers, error_queue, caplog):
    # An immediate retry is routine (INFO: at a busy endpoint's rate WARNINGs bury what
    # matters), a delayed retry is worth a look (WARNING), the error queue needs someone (ERROR).
    temp_handlers(queue, None, lambda m, c: 1 / 0)
    x = transport.send(queue, "x")
    retrying = MessagePump(queue, peek_delay=0.1, immediate_retries=1, delayed_retries=1)
    giving_up = MessagePump(queue, peek_delay=0.1, immediate_retries=0, delayed_retries=0)
    try:
        with caplog.at_level("DEBUG", logger="sluice.recoverability"):
            retrying.receive_and_process(1)
            retrying.receive_and_process(1)
            y = transport.send(queue, "y")
            giving_up.receive_and_process(1)
    finally:
        retrying.close()
        giving_up.close()
    assert len(in_the_store(store)) == 1
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "sluice.recoverability"]
    # Each line names the message, its queue, how far it got and the exception (class and text).
    why, wait = "ZeroDivisionError: division by zero", get_settings().DELAYED_RETRY_INCREASE
    assert logged == [("INFO", f"message {x} on {queue} failed (attempt 1 of 2): {why}"),
                      ("WARNING", f"message {x} on {queue} failed 2 time(s); delayed retry 1 of 1 in {wait:g} s: {why}"),
                      ("ERROR", f"message {y} on {queue} moved to {error_queue} after 1 attempt(s): {why}")], logged


def test_each_delayed_retry_waits_longer_by_the_increase(store, transport, queue, error_queue):
    """Delayed retry n of a message is due n × the increase after its failure, by the
    database's clock."""
    from core.db import database_now_us
    from core.receive.recoverability import Recoverability

    transport.send(queue, "x")
    [message] = transport.browse(queue)
    recoverability = Recoverability(transport, delayed_retries=3, delayed_retry_increase=100)
    before = database_now_us()
    recoverability.schedule_delayed_retry(message, ValueError("nope"), 2, 5)
    [stored] = in_the_store(store)
    due_us = stored.due.timestamp() * 1e6
    assert before + 200e6 - 5e6 <= due_us <= database_now_us() + 200e6, (before, due_us)
    assert stored.headers[Headers.DELAYED_RETRIES] == "2" and stored.headers[Headers.TOTAL_FAILED_ATTEMPTS] == "5"
    assert stored.headers[Headers.MESSAGE_ID] == message.id
