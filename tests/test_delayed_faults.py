"""Delayed delivery under faults: a database outage, killed workers, two movers.

Every test here runs real ``manage.py sluice worker`` processes and checks the
business table (``sluice_demo_ping``: one row per handled Ping) for exactly-once
delivery, and that nothing is left in the delayed store.

- The outage test routes the worker's DATABASE_URL through a TCP proxy
  (tests/tcp_proxy.py) and cuts it.  The issue asks for "a minute" of outage; the
  test uses ``SLUICE_FAULT_OUTAGE_SECONDS`` (default 8 s) with breakers that trigger
  after 2 s, which exercises the same states (armed → TRIGGERED → closed) in a
  fraction of the time.  Set e.g. ``SLUICE_FAULT_OUTAGE_SECONDS=60`` for the full run.
- The SIGKILL test runs on SQLite and PostgreSQL.
- The leader-election test and the SKIP LOCKED unit test need PostgreSQL.

Timings are printed (run with ``-s`` to see them); ``SLUICE_FAULT_VERBOSE=1`` also
prints the workers' logs.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection, connections, transaction

from core.conf import get_settings
from core.delayed import DelayedMessage, SqlDelayedStore, delayed_store
from core.demo.models import PingRecord
from core.models import Lease as LeaseRecord
from core.transport import Transport
from tests.conftest import ROOT, database_url, start_worker, start_workers, wait_for
from tests.tcp_proxy import TcpProxy

OUTAGE_SECONDS = float(os.environ.get("SLUICE_FAULT_OUTAGE_SECONDS", "8"))
MOVED_LINE = re.compile(r"moved (\d+) delayed message\(s\)")


# -- helpers ---------------------------------------------------------------------------------

def _store() -> SqlDelayedStore:
    store = delayed_store()
    assert isinstance(store, SqlDelayedStore), "these tests drive the SQL store"
    return store


def _store_count() -> int:
    store = _store()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {store.dialect.table(store.table)}")
        return cursor.fetchone()[0]


def _pings(ids=None) -> Counter:
    rows = PingRecord.objects.all()
    if ids is not None:
        rows = rows.filter(message_id__in=list(ids))
    return Counter(rows.values_list("message_id", flat=True))


def _assert_exactly_once(ids: list[str]) -> None:
    handled = _pings()
    duplicates = {k: n for k, n in handled.items() if n > 1}
    assert not duplicates, f"handled more than once: {duplicates}"
    missing = set(ids) - set(handled)
    assert not missing, f"{len(missing)} message(s) never handled, e.g. {sorted(missing)[:3]}"
    assert set(handled) == set(ids), f"unexpected pings: {sorted(set(handled) - set(ids))[:3]}"


def _proxied_url(port: int) -> str:
    """database_url() (the test database) with host:port replaced by the proxy's."""
    parts = urlsplit(database_url())
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"))


def _spawn_worker(*args: str, env: dict) -> subprocess.Popen:
    """Like conftest.start_worker but returns at once (the caller polls while it starts)."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "sluice", "worker", *args], cwd=ROOT,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.output = []  # type: ignore[attr-defined]

    def drain() -> None:
        for raw in proc.stdout:
            proc.output.append(raw.decode(errors="replace"))

    threading.Thread(target=drain, daemon=True).start()
    return proc


def _output(proc) -> str:
    return "".join(proc.output)


def _write_transaction_open() -> bool:
    """Is a worker inside a write transaction right now?  PostgreSQL: a mover's (a backend
    with a transaction id whose last statement touched the delayed store).  SQLite: anyone's
    (the write lock is taken: a probe's BEGIN IMMEDIATE fails at once)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL AND query LIKE %s",
                [f"%{get_settings().delayed_table}%"])
            return cursor.fetchone()[0] > 0
    if connection.vendor == "sqlite":
        import sqlite3

        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            probe.close()
    return True  # no way to look: kill as soon as something moved


def _lines(proc, *needles: str) -> list[str]:
    return [line for line in list(proc.output) if all(n in line for n in needles)]


def _moved_by(proc) -> int:
    """Messages this worker's mover moved, from its DEBUG lines (SLUICE_LOG_LEVEL=DEBUG)."""
    return sum(int(m.group(1)) for line in list(proc.output) for m in [MOVED_LINE.search(line)] if m)


def _terminate(proc, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"worker did not stop within {timeout} s of SIGTERM:\n{_output(proc)[-4000:]}")


def _kill_all(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _send_delayed(n: int, delay=None, deliver_at=None) -> list[str]:
    transport = Transport()
    ids = []
    for i in range(n):
        d = delay(i) if callable(delay) else delay
        ids.append(transport.send("demo", {"n": i}, message_type="Ping", delay=d, deliver_at=deliver_at))
    return ids


def _mover_lease_name() -> str:
    return f"delayed-mover:{get_settings().delayed_table}"


def _lease_holder_pid() -> int | None:
    rows = list(LeaseRecord.objects.filter(name=_mover_lease_name()).values_list("holder", "expires_at"))
    assert len(rows) <= 1
    if not rows or not rows[0][0] or rows[0][1] is None:
        return None
    return int(rows[0][0].split(":")[1])


@pytest.fixture
def empty_store(demo):
    """The demo queue set up, and the delayed store (not a Django table: never flushed) empty."""
    store = _store()

    def clear() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {store.dialect.table(store.table)}")

    clear()
    yield store
    clear()


# -- 1. a database outage while messages are due -----------------------------------------------

@pytest.mark.postgresql
@pytest.mark.timeout(120 + 2 * OUTAGE_SECONDS)
def test_database_outage_while_messages_are_due(empty_store):
    """The worker reaches PostgreSQL through a proxy that is cut for OUTAGE_SECONDS while
    50 delayed Pings fall due.  The worker survives, its breakers arm and trigger, and
    once the database is back every message arrives exactly once and the breakers close."""
    s = connection.settings_dict
    env = {
        "SLUICE_TIME_TO_TRIGGER_FETCH_BREAKER": "2",
        "SLUICE_TIME_TO_TRIGGER_DISPATCH_BREAKER": "2",
        "SLUICE_TIME_TO_TRIGGER_RECEIVE_BREAKER": "2",
        "SLUICE_DELAYED_MAX_SLEEP": "1",
    }
    table = get_settings().delayed_table
    fetch, receive = f"delayed-fetch:{table}", "pump-receive:demo"
    with TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)) as proxy:
        worker = start_worker("--queue", "demo", env={**env, "DATABASE_URL": _proxied_url(proxy.port)})
        try:
            # Stored through the test's own (direct) connection, due 3–4.5 s after each send.
            started = time.monotonic()
            ids = _send_delayed(50, delay=lambda i: 3.0 + i * 0.03)
            stored_in = time.monotonic() - started
            assert stored_in < 2.5, f"storing took {stored_in:.1f} s: some would be due before the outage"
            proxy.cut()
            cut_at = time.monotonic()
            assert _store_count() == 50 and not _pings(ids), "a message was moved before the outage"

            # During the outage: the worker lives, the breakers arm, then trigger.
            def triggered() -> bool:
                return all(_lines(worker, f"circuit breaker {name} TRIGGERED") for name in (fetch, receive))

            wait_for(lambda: triggered() or worker.poll() is not None, timeout=OUTAGE_SECONDS + 5,
                     what="fetch and receive breakers to trigger")
            triggered_after = time.monotonic() - cut_at
            remaining = OUTAGE_SECONDS - (time.monotonic() - cut_at)
            if remaining > 0:
                time.sleep(remaining)
            assert worker.poll() is None, f"worker died during the outage:\n{_output(worker)[-4000:]}"
            out = _output(worker)
            for name in (fetch, receive):
                assert f"circuit breaker {name} armed" in out, f"{name} never armed:\n{out[-4000:]}"
                assert f"CRITICAL sluice.breakers: circuit breaker {name} TRIGGERED" in out, \
                    f"{name} never triggered within the outage:\n{out[-4000:]}"
            assert _store_count() == 50 and not _pings(ids), "delivered while the database was unreachable?"
            assert proxy.refused > 0 and proxy.killed > 0, proxy

            # Database back: every message, exactly once; the breakers close.
            proxy.restore()
            restored_at = time.monotonic()
            wait_for(lambda: sum(_pings(ids).values()) >= 50 and _store_count() == 0, timeout=40,
                     what="all 50 delayed pings delivered after the outage")
            delivered_after = time.monotonic() - restored_at
            wait_for(lambda: all(_lines(worker, f"circuit breaker {name}: ", "→ closed") for name in (fetch, receive)),
                     timeout=15, what="fetch and receive breakers closed again")
            _assert_exactly_once(ids)
            assert empty_store.list()[0] == []
            assert Transport().counts("demo").total == 0
            assert worker.poll() is None
        finally:
            code = _terminate(worker)
    assert code == 0, _output(worker)[-4000:]
    _assert_exactly_once(ids)  # again once the worker has finished all it had in flight
    if os.environ.get("SLUICE_FAULT_VERBOSE"):
        print(_output(worker))
    triggered_names = sorted({m.group(1) for m in re.finditer(r"circuit breaker (\S+) TRIGGERED", _output(worker))})
    step_failures = len(_lines(worker, "step failed"))
    print(f"\n[outage] stored 50 in {stored_in:.2f} s; outage {OUTAGE_SECONDS:g} s; breakers triggered "
          f"{triggered_after:.1f} s into it ({', '.join(triggered_names)}); all delivered {delivered_after:.1f} s "
          f"after restore; runner 'step failed' tracebacks: {step_failures}; proxy refused {proxy.refused}, "
          f"reset {proxy.killed} open")


# -- 2. a worker killed while moving a batch ---------------------------------------------------

@pytest.mark.timeout(120)
def test_worker_killed_while_moving_a_batch_loses_and_duplicates_nothing(empty_store):
    """400 Pings due at once; a worker (batch 50) is SIGKILLed as soon as the store shows
    some but not all moved and a write transaction is open (the next batch), three times
    over; then a fresh worker (once the dead one's 2 s lease lapses) finishes.  Exactly
    one ping per message, and the store is empty."""
    n = 400
    env = {"SLUICE_DELAYED_BATCH_SIZE": "50", "SLUICE_MOVER_LEASE_SECONDS": "2", "SLUICE_LOG_LEVEL": "DEBUG"}
    # Stored well ahead (a past time would skip the store), then all made due at one instant.
    ids = _send_delayed(n, deliver_at=dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5))
    store = _store()
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {store.dialect.table(store.table)} "
                       f"SET {store.dialect.quote('Time')} = {store.dialect.now_sql()}", [])
        assert cursor.rowcount == n
    deadline = time.monotonic() + 45
    kills: list[dict] = []
    procs = []
    try:
        for _ in range(3):
            before = _store_count()
            if before == 0:
                break
            proc = _spawn_worker("--queue", "demo", env=env)
            procs.append(proc)
            # Some moved (a batch committed) → kill while the next batch is open.
            left = before
            while left == before:
                assert proc.poll() is None, f"worker exited on its own:\n{_output(proc)[-4000:]}"
                assert time.monotonic() < deadline, "the mover never moved anything"
                time.sleep(0.002)
                left = _store_count()
            busy = False
            while left > 0 and not busy and time.monotonic() < deadline:
                busy = _write_transaction_open()
                left = _store_count()
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
            kills.append({"before": before, "at_kill": left, "mid_transaction": busy, "after": _store_count()})
        assert kills and 0 < kills[0]["at_kill"] < n, f"first kill did not land mid-way: {kills}"
        assert any(k["mid_transaction"] for k in kills), f"no kill landed in an open transaction: {kills}"

        final = start_worker("--queue", "demo", env=env)
        procs.append(final)
        restarted = time.monotonic()
        wait_for(lambda: sum(_pings().values()) >= n and _store_count() == 0
                 and Transport().counts("demo").total == 0, timeout=max(deadline - time.monotonic(), 20),
                 what=f"all {n} pings handled after {len(kills)} kill(s)")
        finished_after = time.monotonic() - restarted
        assert _terminate(final) == 0, _output(final)[-4000:]
    finally:
        _kill_all(procs)
    _assert_exactly_once(ids)
    assert _store_count() == 0 and empty_store.list()[0] == []
    moved = [_moved_by(p) for p in procs]
    if os.environ.get("SLUICE_FAULT_VERBOSE"):
        for p in procs:
            print(f"---- worker {p.pid}\n" + "".join(l for l in p.output if "sluice.pump: handled" not in l))
    print(f"\n[sigkill] {connection.vendor}: kills = {kills}; "
          f"committed moves per worker (DEBUG lines) = {moved}; final worker finished in "
          f"{finished_after:.1f} s")


# -- 3. two movers, one store: leader election and hand-over --------------------------------

@pytest.mark.row_locking
@pytest.mark.timeout(120)
def test_two_movers_elect_one_leader_and_hand_over_on_graceful_stop(empty_store):
    """Two workers on one PostgreSQL store; 500 Pings fall due over ~2 s.  Exactly once,
    one lease holder, and only the holder moves (per-process counts from the movers'
    DEBUG lines).  SIGTERM the leader: it releases the lease, and messages that fall due
    afterwards are moved by the other worker within ~2 s of their due time."""
    lease_seconds = float(os.environ.get("SLUICE_FAULT_LEASE_SECONDS", "3"))  # stand-by retries every min(lease/2, 5) s
    env = {"SLUICE_MOVER_LEASE_SECONDS": str(lease_seconds), "SLUICE_LOG_LEVEL": "DEBUG"}
    workers = start_workers(2, "--queue", "demo", env=env)
    try:
        pids = {w.pid: w for w in workers}
        leader_pid = wait_for(lambda: _lease_holder_pid(), timeout=10, what="a mover to take the lease")
        assert leader_pid in pids, f"lease held by {leader_pid}, not one of {list(pids)}"

        ids = _send_delayed(500, delay=lambda i: 2.0 + 2.0 * i / 500)
        wait_for(lambda: sum(_pings(ids).values()) >= 500 and _store_count() == 0, timeout=40,
                 what="500 delayed pings delivered")
        _assert_exactly_once(ids)
        assert LeaseRecord.objects.filter(name=_mover_lease_name()).count() == 1
        assert _lease_holder_pid() == leader_pid, "leadership changed hands while both workers ran"
        leader = pids[leader_pid]
        follower = next(w for w in workers if w is not leader)
        moved = {"leader": _moved_by(leader), "follower": _moved_by(follower)}
        assert moved == {"leader": 500, "follower": 0}, f"per-process moved counts: {moved}"

        # Graceful stop of the leader: the lease is released at once, the follower takes over.
        # Two sets fall due after the stop: one stored while the leader still ran (the
        # follower was told, but the lease was taken), one stored after the stop.
        due_early = 3.0
        early_stored = time.monotonic()  # (before: latencies below are upper bounds)
        early = _send_delayed(50, delay=due_early)
        assert _terminate(leader) == 0, _output(leader)[-4000:]
        stopped_at = time.monotonic()
        assert stopped_at - early_stored < due_early, "the leader took too long to stop"
        assert _moved_by(leader) == 500, "the leader moved messages that fell due after it stopped?"
        holder = _lease_holder_pid()
        assert holder in (None, follower.pid), f"lease still held by the stopped leader ({holder})"

        # Nothing else wakes the follower until these have arrived.  Latencies past the due
        # time: "moved" (out of the store: the mover) and "handled" (+ the pump's peek delay).
        def delivered(batch, stored_at, due, name):
            moved_at = wait_for(lambda: _store_count() == 0 and time.monotonic(), timeout=20, interval=0.01,
                             what=f"{name} messages moved")
            wait_for(lambda: sum(_pings(batch).values()) >= 50, timeout=20, interval=0.01,
                     what=f"{name} messages handled")
            return {"moved": moved_at - stored_at - due, "handled": time.monotonic() - stored_at - due}

        latency = {"early": delivered(early, early_stored, due_early, "early (stored before the stop)")}
        due_late = 1.0
        late_stored = time.monotonic()
        late = _send_delayed(50, delay=due_late)
        latency["late"] = delivered(late, late_stored, due_late, "late (stored after the stop)")
        assert max(latency["early"]["moved"], latency["late"]["moved"]) < 2.5, \
            f"the follower took too long past the due time: {latency}"
        assert _lease_holder_pid() == follower.pid
        assert _store_count() == 0
        assert _moved_by(follower) == 100 and _moved_by(leader) == 500
        assert _terminate(follower) == 0, _output(follower)[-4000:]
    finally:
        _kill_all(workers)
    _assert_exactly_once(ids + early + late)  # with both stopped: nothing left in flight
    assert _store_count() == 0
    print(f"\n[leader] lease {lease_seconds:g} s: leader pid {leader_pid} moved 500, follower 0; after SIGTERM, "
          f"seconds past the due time (upper bounds): "
          + "; ".join(f"{k}: moved {v['moved']:.2f}, handled {v['handled']:.2f}" for k, v in latency.items()))


# -- 4. SKIP LOCKED: two concurrent fetches take disjoint rows ---------------------------------

@pytest.mark.row_locking
@pytest.mark.timeout(60)
@pytest.mark.parametrize("take", ["fetch_due", "claim_due"])  # the mover's locking fetch and its claim
def test_fetch_due_in_two_concurrent_transactions_returns_disjoint_rows(empty_store, take):
    store = SqlDelayedStore()
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    stored = set()
    for i in range(20):
        message_id = str(uuid.uuid4())
        store.store(DelayedMessage(id=message_id, destination="demo", body=b"{}", headers={"n": str(i)}, due=past))
        stored.add(message_id)

    got: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    first_holds = threading.Event()
    second_done = threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                got["first"] = [m.id for m in getattr(SqlDelayedStore(), take)(15)]
                first_holds.set()
                assert second_done.wait(20), "second fetch never finished"
                transaction.set_rollback(True)
        except BaseException as exc:  # noqa: BLE001 — reported in the test thread
            errors.append(exc)
        finally:
            first_holds.set()
            connections.close_all()

    def second() -> None:
        try:
            assert first_holds.wait(20)
            with transaction.atomic():
                got["second"] = [m.id for m in getattr(SqlDelayedStore(), take)(15)]
                transaction.set_rollback(True)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            second_done.set()
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    a, b = got["first"], got["second"]
    assert len(a) == 15 and len(b) == 5, (len(a), len(b))
    assert not set(a) & set(b), "both transactions were handed the same row"
    assert set(a) | set(b) == stored
    # (No clock needed: the first holds its rows until the second has finished, so a second
    # fetch that waited for those locks would never finish — "second fetch never finished".)
    # Both rolled back: every row is still there and fetchable.
    with transaction.atomic():
        assert {m.id for m in store.fetch_due(100)} == stored


# -- 5. known engine bug: a refused connection bypasses the mover's fetch breaker ------------

_MOVER_SCRIPT = """
import json, sys
from core.delayed import DelayedMover
mover = DelayedMover()          # elected, as in `sluice worker`
mover.step()                    # database up: takes the lease (renewed again after lease/3 s)
print("ready", flush=True)
sys.stdin.readline()            # the test cuts the database now
steps = []
for _ in range(3):
    try:
        mover.step()
        steps.append("ok")
    except Exception as exc:
        steps.append(type(exc).__name__)
print("RESULT " + json.dumps({"steps": steps, "fetch_breaker": mover.fetch_breaker.state}), flush=True)
mover.close()
"""


@pytest.mark.postgresql
@pytest.mark.timeout(60)
def test_mover_reports_a_refused_connection_to_its_fetch_breaker(empty_store):
    s = connection.settings_dict
    with TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)) as proxy:
        env = {**os.environ, "DATABASE_URL": _proxied_url(proxy.port), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "shell", "-c", _MOVER_SCRIPT], cwd=ROOT,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.strip() == "ready":
                    break
            if not lines or lines[-1].strip() != "ready":
                pytest.fail("mover script did not start:\n" + "".join(lines))
            proxy.cut()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out = proc.communicate(timeout=30)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    result = next((line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        pytest.fail("mover script gave no result:\n" + out[-4000:])
    outcome = json.loads(result)
    # Expected: each step returns a pause and the failures arm the fetch breaker.
    assert outcome == {"steps": ["ok", "ok", "ok"], "fetch_breaker": "armed"}, outcome
