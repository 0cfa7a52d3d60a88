"""Shared fixtures.  Tests run against the database in DATABASE_URL (SQLite or
PostgreSQL; `make test` runs the suite once on each)."""
from __future__ import annotations

import contextlib
import copy
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from core.runtime import limits, pauses
from core.runtime.marks import receive_marks
from core.monitoring.windows import forget_windows
from core.handlers import handlers
from core.queues import create_queue, delete_queue, registry
from core.transport import Transport
from tests.sharding import DurationRecorder, split, test_file

ROOT = Path(__file__).resolve().parent.parent

# Servers and workers refuse to start with DEBUG off and no secret key of their own
# (core/startup.py).  The tests start real ones (Celery workers, `sluice worker`,
# gunicorn) as child processes, which inherit this environment: a random key per run.
os.environ.setdefault("DJANGO_SECRET_KEY", "tests-" + secrets.token_urlsafe(40))


# A pytest started in the background by a non-interactive shell (make test's passes, a CI
# runner's step) has SIGINT ignored, and its children would inherit that: a test's Ctrl-C
# (SIGINT) to a child would do nothing, and bash cannot even trap a signal ignored on entry
# (scripts/run.sh in tests/test_deploy.py).  Children must start as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: DATABASE_URL scheme → the database the suite runs on.
SCHEMES = {"sqlite": "sqlite", "postgres": "postgresql", "postgresql": "postgresql", "pgsql": "postgresql",
           "mssql": "mssql"}
#: Marker → the databases its tests run on (skipped, with the reason, on the others).
#: ``row_locking``: a server database where concurrent transactions lock rows and skip
#: rows others hold (SKIP LOCKED / READPAST) — what scale-out and concurrency tests need;
#: ``postgresql`` / ``mssql``: tests that use that database's own SQL or features.
DATABASE_MARKERS = {
    "postgresql": {"postgresql"},
    "mssql": {"mssql"},
    "row_locking": {"postgresql", "mssql"},
}


def database_vendor(url: str | None = None) -> str:
    """sqlite, postgresql or mssql, from DATABASE_URL."""
    url = url if url is not None else os.environ.get("DATABASE_URL", "sqlite:")
    scheme = url.split(":", 1)[0].lower()
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise pytest.UsageError(f"DATABASE_URL scheme {scheme!r} is not one the tests know") from None


#: Fixtures through which a test uses the test database (pytest-django's, and live_server's).
DATABASE_FIXTURES = {"db", "transactional_db", "live_server", "django_db_reset_sequences",
                     "django_db_serialized_rollback"}
#: Markers of tests that run in one pass of `make test` only, the SQLite one: they never touch
#: the test database (or, for the browser, test nothing a database changes), so a second pass
#: would only double their minutes.  Each maps to the
#: skip reason on the other databases.  ``SLUICE_TEST_ONE_PASS=always`` (or, for Spark,
#: the older ``SLUICE_TEST_SPARK_ONLY=always``) runs them in every pass.
ONE_PASS_MARKERS = {
    "spark_only": "Spark only, no database: runs in the SQLite pass of make test",
    "no_database": "uses no test database (a database of its own, or none): runs in the SQLite pass of make test",
    # The browser tests check what a page does in Chromium (htmx swaps, forms, CSP, themes);
    # what the pages read from each database is the Django test client's tests' part, in
    # every pass.  Their pass is SQLite's, the embedded default, where a live server's
    # requests meet the one-writer lock.
    "browser": "a browser test: runs in the SQLite pass of make test (pages on each database: the test-client tests)",
}


def pytest_configure(config):
    if shard():
        # Each file's time, for the next run's split (tests/sharding.py).
        config.pluginmanager.register(DurationRecorder(database_vendor()), "sluice-test-durations")
    # Registered here, not in pyproject.toml: scripts/bootstrap.sh reinstalls the project
    # whenever pyproject.toml changes.
    config.addinivalue_line(
        "markers", "no_database: uses no test database (a SQLite file of its own, or none), so the database the "
        "suite runs on changes nothing: runs in one pass of make test, the SQLite one (refused on a test that "
        "uses the test database)")


def uses_test_database(item) -> bool:
    return item.get_closest_marker("django_db") is not None or \
        bool(DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())))


def shard() -> tuple[int, int] | None:
    """``SLUICE_TEST_SHARD=K/N``: this pytest runs part K of N of the suite (whole test files,
    balanced on their recorded times: tests/sharding.py), with test databases of its own —
    how make test runs each database's pass as N pytest processes at once
    (scripts/test_passes.sh)."""
    value = os.environ.get("SLUICE_TEST_SHARD", "")
    if not value:
        return None
    try:
        k, n = (int(x) for x in value.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"SLUICE_TEST_SHARD={value!r}: want K/N with 1 <= K <= N")
    return k, n


def pytest_collection_modifyitems(config, items):
    vendor = database_vendor()
    part = shard()
    if part:
        k, n = part
        mine = split(items, n, vendor)[k - 1]
        config.hook.pytest_deselected(items=[item for item in items if test_file(item) not in mine])
        items[:] = [item for item in items if test_file(item) in mine]
    always = os.environ.get("SLUICE_TEST_ONE_PASS") == "always"
    for item in items:
        for marker, vendors in DATABASE_MARKERS.items():
            if marker in item.keywords and vendor not in vendors:
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {' or '.join(sorted(vendors))} (DATABASE_URL is {vendor})"))
                break
        if "no_database" in item.keywords and uses_test_database(item):
            # Skipping it on PostgreSQL would lose coverage: the marker must be true.
            raise pytest.UsageError(f"{item.nodeid} is marked no_database but uses the test database")
        for marker, reason in ONE_PASS_MARKERS.items():
            if marker in item.keywords and vendor != "sqlite" and not always and not (
                    marker == "spark_only" and os.environ.get("SLUICE_TEST_SPARK_ONLY") == "always"):
                item.add_marker(pytest.mark.skip(reason=reason))
                break


OTHER = "other"
#: Mark a test that uses the second database (alias ``other``) as well as the default one.
uses_other_database = pytest.mark.django_db(transaction=True, databases=["default", OTHER])


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """A second database, alias ``other``, beside the default one: where ``queue@other``
    outbox destinations go.  A sibling of the default database (``<name>-other`` file on
    SQLite, ``<name>_other`` on the same PostgreSQL server); pytest-django creates and
    migrates its test database only when a collected test is marked with
    ``databases=[…, "other"]`` (:data:`uses_other_database`)."""
    from django.conf import settings
    from django.db import connections

    if OTHER not in connections.settings:  # else SLUICE_OTHER_DATABASE_URL set for this run
        other = copy.deepcopy(connections["default"].settings_dict)
        if other["ENGINE"].endswith("sqlite3"):
            path = Path(other["NAME"])
            other["NAME"] = str(path.with_name(f"{path.stem}-other{path.suffix}"))
            other["TEST"] = {**other["TEST"], "NAME": str(path.with_name(f"test_{path.stem}-other{path.suffix}"))}
        else:
            other["NAME"] = f"{other['NAME']}_other"
            other["TEST"] = {**other["TEST"], "NAME": None}
        settings.DATABASES[OTHER] = other
        connections.settings[OTHER] = other
    part = shard()
    if part:
        # The parts of a pass run at once, on the same server: test databases of their own.
        for alias in (DEFAULT_DB_ALIAS, OTHER):
            db = connections.settings[alias]
            db["TEST"] = {**db.get("TEST", {})}
            db["TEST"]["NAME"] = f"{db['TEST'].get('NAME') or 'test_' + db['NAME']}_part{part[0]}"
            settings.DATABASES[alias] = db


@pytest.fixture(scope="session", autouse=True)
def _static_files_by_plain_names():
    """Production names static files by content hash from the manifest that `collectstatic`
    writes (sluice/settings.py).  The tests never run collectstatic: with the manifest
    missing {% static %} would raise, so they use plain names, which the test client and
    live_server's handler serve from the apps' static folders.  tests/test_deploy.py runs
    the manifest path for real (collectstatic, gunicorn, WhiteNoise)."""
    from django.conf import settings
    from django.test import override_settings

    storages = {**settings.STORAGES,
                "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    # Dashboard tests create users by the hundred: PBKDF2's deliberate slowness (about half a
    # second per password here) would cost minutes, and proves nothing about Sluice.
    with override_settings(STORAGES=storages, PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _independent_alias(django_db_setup):
    """The receive_only pump's second connection, registered once the test database
    exists (Django's test case only allows aliases it knows when a test starts)."""
    from core.db import independent_alias
    from core.runtime.wakeups import shutdown

    independent_alias("default")
    yield
    shutdown()  # the wake-up listener's and notifier's connections, before the database is dropped


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole test session (its JVM takes seconds to start):
    two cores, a small heap, no UI, logs at WARN."""
    from pipeline import job

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = job.session("local[2]", app_name="sluice-tests", ui=False, driver_memory="1g",
                          extra={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _fresh_registry_cache():
    registry.forget()
    pauses.forget()  # the database is flushed between tests without a word to the boards
    limits.forget()
    receive_marks.forget()
    forget_windows()  # SQLite reuses the ids of a flushed table: a range's cached windows would match
    yield
    registry.forget()
    pauses.forget()
    limits.forget()
    receive_marks.forget()
    forget_windows()


@pytest.fixture
def make_queue(transactional_db):
    """Create queues with unique names; their tables are dropped afterwards.

    Queue tables are not Django-managed, so a test database flush would not empty
    them: every test gets names of its own.
    """
    made: list[str] = []

    def make(prefix: str = "q", **options) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        create_queue(name, **options)
        made.append(name)
        if options.get("dead_letter_on_expiry"):
            made.append(name + ".deadletter")
        return name

    yield make
    for name in made:
        try:
            delete_queue(name)
        except Exception:
            pass


@pytest.fixture
def queue(make_queue) -> str:
    return make_queue()


class HandClock:
    """A clock moved by hand (``now``, seconds), for code that reads one through ``_clock``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def marks_clock(monkeypatch) -> HandClock:
    """The receive marks' clock (core.runtime.marks), still until a test moves it."""
    fake = HandClock()
    monkeypatch.setattr(receive_marks, "_clock", fake)
    receive_marks.forget()
    yield fake
    receive_marks.forget()


@pytest.fixture
def transport(transactional_db) -> Transport:
    return Transport()


@pytest.fixture
def error_queue(transactional_db) -> str:
    """The error queue, created and emptied."""
    create_queue("error", kind="error")
    Transport().purge("error")
    yield "error"
    Transport().purge("error")


@pytest.fixture
def demo(transactional_db, error_queue) -> str:
    """The shipped demo endpoint's queue, set up and empty."""
    from core.setup import setup_infrastructure

    setup_infrastructure()
    Transport().purge("demo")
    yield "demo"
    Transport().purge("demo")


@pytest.fixture
def temp_handlers():
    """Register handlers for a test only: ``temp_handlers(queue, type, fn)``."""
    added = []

    def register(queue, message_type, fn):
        handlers.register(queue, message_type, fn)
        added.append((queue, message_type))
        return fn

    yield register
    for key in added:
        handlers.unregister(*key)


@pytest.fixture
def outbox(transactional_db):
    """The endpoint's outbox (table created, emptied before and after the test).

    Outbox tables are not Django-managed: the test database flush leaves them alone."""
    from core.outbox import Outbox, create_outbox_table

    create_outbox_table()
    box = Outbox()
    clear_outbox(box)
    yield box
    clear_outbox(box)


def clear_outbox(box) -> None:
    with connections[box.using].cursor() as cursor:
        cursor.execute(f"DELETE FROM {box.store.dialect.table(box.store.table)}")


@pytest.fixture
def other_outbox(outbox):
    """The outbox of an endpoint on the ``other`` database (a receiving endpoint)."""
    from core.outbox import Outbox, create_outbox_table

    create_outbox_table(OTHER)
    box = Outbox(OTHER)
    clear_outbox(box)
    yield box
    clear_outbox(box)


@pytest.fixture
def make_other_queue(transactional_db):
    """Like make_queue, on the ``other`` database."""
    made: list[str] = []

    def make(prefix: str = "q", **options) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        create_queue(name, using=OTHER, **options)
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            delete_queue(name, using=OTHER)
        except Exception:
            pass


def put_row(queue: str, body, *, headers: dict[str, str], message_id: str | None = None,
            message_type: str | None = None) -> str:
    """Write a row the way Sluice's own moves (or another endpoint writing into the table)
    do: control headers such as ``FailedQ`` or ``Sluice.FailedAttempts`` included, which a
    producer's ``send()`` drops.  Returns the message id."""
    transport = Transport()
    built = transport.build(queue, body, message_type=message_type, message_id=message_id)
    transport.enqueue([transport.outgoing(queue, built.message_id, {**built.headers, **headers}, built.body,
                                          forever=True)])
    return built.message_id


def put_raw_row(queue: str, header_text: str, body: bytes) -> str:
    """A row whose Headers column holds ``header_text`` exactly, as another system wrote it
    (header text nobody can read: a poison row).  Returns its id."""
    from core.queues import dialect

    row_id = str(uuid.uuid4())
    with connection.cursor() as cursor:
        cursor.execute(dialect().insert_with_expires(queue), [row_id, None, None, None, header_text, body])
    return row_id


def listening(pump) -> None:
    """Wait until the pump's LISTEN connection is up, where it has one (PostgreSQL):
    connecting wakes every loop once, which must not land in the middle of a test's steps."""
    if pump._listener is not None:
        assert pump._listener.connected.wait(10)


def drain(pump, max_steps: int = 200) -> None:
    """Run pump steps until a peek finds the queue empty."""
    for _ in range(max_steps):
        if pump.step() > 0:
            return
    raise AssertionError("queue did not drain")


@pytest.fixture
def pump_for(transactional_db):
    """Make message pumps for a test; closed afterwards.  Defaults suit tests: a 0.1 s peek
    delay and no delayed retries (failures reach the error queue after the immediate
    retries; tests/test_delayed.py covers delayed retries)."""
    from core.receive.pump import MessagePump

    pumps = []

    def make(queue, **options):
        options.setdefault("peek_delay", 0.1)
        options.setdefault("delayed_retries", 0)
        pump = MessagePump(queue, **options)
        pumps.append(pump)
        return pump

    yield make
    for pump in pumps:
        pump.close()


def database_url(alias: str = "default") -> str:
    """A DATABASE_URL for the database the tests are using (the test database)."""
    conn = connections[alias]
    s = conn.settings_dict
    if conn.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = quote(s["USER"] or "")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"])
    if conn.vendor == "microsoft":  # back through sluice.dburl's mssql:// form
        options = s.get("OPTIONS", {})
        query = [("driver", options.get("driver", "ODBC Driver 18 for SQL Server"))]
        if options.get("python_driver"):
            query.append(("python_driver", options["python_driver"]))
        query += [tuple(p.split("=", 1)) for p in (options.get("extra_params") or "").split(";") if "=" in p]
        return (f"mssql://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 1433}/{s['NAME']}?"
                + "&".join(f"{k}={quote(v)}" for k, v in query))
    return f"postgresql://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def manage(*args: str, env: dict | None = None, timeout: float = 120, check: bool = False,
           input: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``manage.py`` in a child process against the test database."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), **(env or {})}
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=full_env,
                            capture_output=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stderr.decode()}")
    return result


def start_workers(count: int, *args: str, env: dict | None = None) -> list[subprocess.Popen]:
    """Start ``count`` ``manage.py sluice worker`` processes together; returns once all serve.

    Their output is kept in ``proc.output`` (read continuously, so a chatty worker
    never blocks on a full pipe)."""
    full_env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1", **(env or {})}
    procs = []
    for _ in range(count):
        proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "sluice", "worker", *args], cwd=ROOT,
                                env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        proc.output = []  # type: ignore[attr-defined]
        proc.serving = threading.Event()  # type: ignore[attr-defined]

        def drain(proc=proc) -> None:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                proc.output.append(line)
                if "worker serving" in line:
                    proc.serving.set()

        threading.Thread(target=drain, daemon=True).start()
        procs.append(proc)
    deadline = time.monotonic() + 60
    for proc in procs:
        while not proc.serving.is_set():
            if proc.poll() is not None:
                raise AssertionError(f"worker exited with {proc.returncode} before serving:\n{''.join(proc.output)}")
            if time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise AssertionError("worker did not start within 60 s")
            proc.serving.wait(0.1)
    return procs


def start_worker(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start one ``manage.py sluice worker``; returns once it serves."""
    return start_workers(1, *args, env=env)[0]


def wait_for(predicate, timeout: float = 30, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@contextlib.contextmanager
def open_transaction(work, timeout: float = 10):
    """Run ``work()`` in a transaction on another thread (another connection) and keep
    that transaction open — its locks held — until the block ends; then it commits."""
    ready, release = threading.Event(), threading.Event()

    def run() -> None:
        try:
            with transaction.atomic():
                work()
                ready.set()
                release.wait(timeout)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert ready.wait(timeout), "the other transaction did not start"
        yield
    finally:
        release.set()
        thread.join(timeout)


@pytest.fixture(autouse=True)
def _fresh_api_throttles():
    """DRF's throttles count requests in the default (per-process) cache: every test starts
    with none counted, so a suite's many anonymous API calls never add up to a 429."""
    from django.core.cache import caches

    caches["default"].clear()
    yield
