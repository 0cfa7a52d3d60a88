"""Django's Tasks framework on Sluice (core.tasks): the backend contract against real
databases — enqueue → run → result, enqueue rolled back with the caller's transaction,
run_after by the database's clock, retries then FAILED and a failed-message group, the
dashboard's Retry to SUCCESSFUL, async tasks, context, signals, checks and retention."""
from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.core import checks
from django.db import connections, transaction
from django.test import override_settings

from core.db import database_now_us
from core.demo.models import PingRecord
from core.delayed import DelayedMover, SqlDelayedStore
from core.failures import ingest_errors
from core.failures.search import groups
from core.models import BulkOperation, FailedMessage, TaskResultRecord
from core.tasks.framework import InvalidTaskError, TaskResultDoesNotExist, TaskResultStatus, task_enqueued, \
    task_finished, task_started
from core.transport import Transport
from tests.conftest import drain
from tests.dashboard_api_support import clean_broker  # noqa: F401
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user, operator  # noqa: F401
from tests.tasks_support import tasks_on_sluice  # noqa: F401


def run_all(pump_for, setup, **options) -> None:
    drain(pump_for(setup.queue, concurrency=1, **options))


def in_a_thread_of_its_own(fn):
    """``fn()`` in a new thread, as a worker's pump thread runs: where no event loop runs.
    The browser tests' Playwright leaves one running in the test thread of the same pytest
    process, and async_to_sync (an async task's call) refuses to run beside it."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 — raised again in the test's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(120)
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_enqueue_run_and_the_result(tasks_on_sluice, pump_for):
    from tests.task_funcs import add

    result = add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and result.enqueued_at is not None
    assert result.backend == "default" and result.args == [2, 3]
    # One message in the task's queue, named like the task.
    [message] = Transport().browse(tasks_on_sluice.queue)
    assert message.id == result.id and message.headers["Django.Task"] == "tests.task_funcs.add"
    assert add.get_result(result.id).status == TaskResultStatus.READY
    run_all(pump_for, tasks_on_sluice)
    done = add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.started_at <= done.finished_at and done.last_attempted_at == done.started_at
    assert done.enqueued_at <= done.started_at
    assert done.attempts == 1 and len(done.worker_ids) == 1 and done.errors == []
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_an_enqueue_is_one_round_trip_where_the_database_can(tasks_on_sluice):
    """The message and its result row go in one statement on PostgreSQL (and SQL Server:
    tests/test_dialect_mssql.py), two on SQLite, which runs in the process."""
    from django.test.utils import CaptureQueriesContext

    from core.dialects import dialect_for
    from tests.task_funcs import add

    connection = connections["default"]
    one_statement = dialect_for(connection).insert_along("INSERT 1", "INSERT 2") is not None
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        result = add.enqueue(1, 1)
    statements = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("INSERT", "WITH"))]
    assert len(statements) == (1 if one_statement else 2), statements
    [message] = Transport().browse(tasks_on_sluice.queue)
    assert message.id == result.id
    assert add.get_result(result.id).enqueued_at == result.enqueued_at


def test_database_work_commits_once_with_the_receive(tasks_on_sluice, pump_for):
    from tests.task_funcs import record_ping

    results = [record_ping.enqueue(f"k{i}") for i in range(30)]
    run_all(pump_for, tasks_on_sluice)
    assert sorted(PingRecord.objects.values_list("message_id", flat=True)) == sorted(f"k{i}" for i in range(30))
    assert {record_ping.get_result(r.id).status for r in results} == {TaskResultStatus.SUCCESSFUL}


def test_an_enqueue_rolled_back_with_its_transaction_never_runs(tasks_on_sluice, pump_for):
    from tests.task_funcs import record_ping

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        with transaction.atomic():
            lost = record_ping.enqueue("lost")
            raise Abort
    kept = record_ping.enqueue("kept")
    run_all(pump_for, tasks_on_sluice)
    assert list(PingRecord.objects.values_list("message_id", flat=True)) == ["kept"]
    assert not TaskResultRecord.objects.filter(pk=lost.id).exists()
    with pytest.raises(TaskResultDoesNotExist):
        record_ping.get_result(lost.id)
    assert record_ping.get_result(kept.id).status == TaskResultStatus.SUCCESSFUL


def test_run_after_is_never_early_by_the_database_clock(tasks_on_sluice, pump_for):
    from tests.task_funcs import add

    store = SqlDelayedStore()
    store.setup_infrastructure()
    now = dt.datetime.fromtimestamp(database_now_us() / 1e6, tz=dt.timezone.utc)
    due = now + dt.timedelta(seconds=1.5)
    result = add.using(run_after=due).enqueue(1, 1)
    assert result.task.run_after == due
    assert Transport().browse(tasks_on_sluice.queue) == []  # in the delayed store, not the queue
    pump = pump_for(tasks_on_sluice.queue, concurrency=1)
    mover = DelayedMover(store, max_sleep=0.2)
    try:
        deadline = time.monotonic() + 20
        while add.get_result(result.id).status != TaskResultStatus.SUCCESSFUL:
            assert time.monotonic() < deadline, "the delayed task never ran"
            mover.step()
            pump.receive_and_process(10)
            time.sleep(0.05)
    finally:
        mover.close()
    done = add.get_result(result.id)
    assert done.started_at >= due, (done.started_at, due)
    assert done.return_value == 2


def test_a_failing_task_is_retried_then_failed_and_grouped_then_retried_from_the_dashboard(
        tasks_on_sluice, pump_for, operator, clean_broker):  # noqa: F811
    from core.failures import run_operation
    from dashboard import actions
    from tests import task_funcs

    key = "always"
    task_funcs.FAIL_NEXT[key] = 3
    result = task_funcs.flaky.enqueue(key)
    run_all(pump_for, tasks_on_sluice, immediate_retries=2)
    failed = task_funcs.flaky.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 3 and len(failed.errors) == 3
    assert failed.errors[-1].exception_class_path == "builtins.ValueError"
    assert failed.errors[-1].exception_class is ValueError
    assert "fails on attempt 3" in failed.errors[-1].traceback and "Traceback" in failed.errors[-1].traceback
    assert failed.finished_at is not None
    with pytest.raises(ValueError):
        failed.return_value
    # Each failed attempt's database work rolled back with it.
    assert not PingRecord.objects.filter(message_id__startswith=f"{key}-").exists()
    # The error queue → a failed-message record in a group, as for any message.
    ingest_errors()
    record = FailedMessage.objects.get(message_id=result.id)
    assert record.original_queue == tasks_on_sluice.queue
    assert any(g.count >= 1 and "ValueError" in g.exception_type for g in groups(queue=tasks_on_sluice.queue))
    # Retry, the dashboard's action (a bulk operation a Celery worker runs: run here).
    task_funcs.FAIL_NEXT[key] = 0
    started = actions.retry_failed(operator, {"ids": [record.pk]}, via="web")
    run_operation(started.operation_id)
    assert BulkOperation.objects.get(pk=started.operation_id).status == "finished"
    run_all(pump_for, tasks_on_sluice, immediate_retries=2)
    done = task_funcs.flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"key": key, "attempt": 4}
    assert done.attempts == 4 and len(done.errors) == 3
    assert list(PingRecord.objects.filter(message_id__startswith=f"{key}-").values_list("message_id", flat=True)) \
        == [f"{key}-4"]


def test_a_task_that_succeeds_on_a_retry(tasks_on_sluice, pump_for):
    from tests import task_funcs

    task_funcs.FAIL_NEXT["once"] = 1
    result = task_funcs.flaky.enqueue("once")
    run_all(pump_for, tasks_on_sluice, immediate_retries=2)
    done = task_funcs.flaky.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"key": "once", "attempt": 2}
    assert len(done.errors) == 1 and done.attempts == 2


def test_an_async_task(tasks_on_sluice, pump_for):
    from tests.task_funcs import async_double

    result = async_double.enqueue(21)
    in_a_thread_of_its_own(lambda: run_all(pump_for, tasks_on_sluice))
    done = async_double.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 42
    assert PingRecord.objects.filter(message_id="async-21").count() == 1


def test_aenqueue_and_aget_result(tasks_on_sluice, pump_for):
    from asgiref.sync import async_to_sync

    from tests.task_funcs import add

    result = in_a_thread_of_its_own(lambda: async_to_sync(add.aenqueue)(4, 5))
    run_all(pump_for, tasks_on_sluice)
    done = in_a_thread_of_its_own(lambda: async_to_sync(add.aget_result)(result.id))
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 9


def test_signals_fire_once_each(tasks_on_sluice, pump_for):
    from tests.task_funcs import add

    seen: list[tuple[str, str, str]] = []

    def receiver(name):
        def on(sender, task_result, **kwargs):
            seen.append((name, task_result.id, task_result.status))
        return on

    receivers = {signal: receiver(name) for signal, name in
                 ((task_enqueued, "enqueued"), (task_started, "started"), (task_finished, "finished"))}
    for signal, fn in receivers.items():
        signal.connect(fn)
    try:
        result = add.enqueue(1, 2)
        run_all(pump_for, tasks_on_sluice)
    finally:
        for signal, fn in receivers.items():
            signal.disconnect(fn)
    assert seen == [("enqueued", result.id, TaskResultStatus.READY), ("started", result.id, TaskResultStatus.RUNNING),
                    ("finished", result.id, TaskResultStatus.SUCCESSFUL)]


def test_a_failed_task_is_logged_with_its_exception(tasks_on_sluice, pump_for, caplog):
    """The framework logs task_finished on its logger ("django.tasks"; "django_tasks" in the
    backport); a FAILED task's line carries the task's own exception (not the pump's
    wrapper of it), as with the framework's own backends."""
    from core.tasks.framework import FRAMEWORK
    from tests import task_funcs

    logger = "django.tasks" if FRAMEWORK == "django.tasks" else "django_tasks"
    task_funcs.FAIL_NEXT["logged"] = 1
    with caplog.at_level("INFO", logger=logger):
        result = task_funcs.flaky.enqueue("logged")
        run_all(pump_for, tasks_on_sluice, immediate_retries=0)
    [failed] = [r for r in caplog.records if r.name == logger and r.levelname == "ERROR"]
    assert result.id in failed.getMessage() and "state=FAILED" in failed.getMessage()
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], ValueError), failed.exc_info


def test_the_backend_refuses_what_it_cannot_do(tasks_on_sluice):
    from tests.task_funcs import add

    backend = tasks_on_sluice.backend
    assert backend.supports_defer and backend.supports_get_result and backend.supports_async_task
    assert not backend.supports_priority
    with pytest.raises(InvalidTaskError):
        add.using(priority=5)
    with pytest.raises(InvalidTaskError):
        add.using(queue_name="elsewhere")
    # Arguments that are not JSON: the framework's InvalidTask and, as its other backends
    # raise, its TypeError "Unsupported type".
    with pytest.raises(InvalidTaskError):
        add.enqueue(object(), 1)
    with pytest.raises(TypeError, match="Unsupported type"):
        add.enqueue(object(), 1)
    assert not TaskResultRecord.objects.exists()


def test_arguments_no_database_takes_are_refused_at_enqueue(tasks_on_sluice):
    """NaN, infinities and lone surrogates pass Python's json module but no database's JSON
    or text: refused at enqueue with the framework's error, naming the arguments, and
    nothing is written (not a database error that breaks the caller's transaction)."""
    from tests.task_funcs import add

    for bad in (float("nan"), float("inf"), "\ud800", {"name": "\udfff"}):
        with transaction.atomic():
            with pytest.raises(InvalidTaskError, match="task arguments must be JSON"):
                add.enqueue(bad, 1)
            add.enqueue(1, 1)  # the caller's transaction goes on
    assert TaskResultRecord.objects.count() == 4
    assert len(Transport().browse(tasks_on_sluice.queue)) == 4


def test_a_tasks_message_body_is_the_json_send_would_write(tasks_on_sluice):
    """The message body carries the task and its arguments as send() writes a JSON body
    (compact, non-ASCII as is), whatever the arguments' types."""
    import json

    from tests.task_funcs import add

    result = add.enqueue("café", ("x", b"y"))
    [message] = Transport().browse(tasks_on_sluice.queue)
    expected = {"task": "tests.task_funcs.add", "backend": "default", "queue_name": "default",
                "args": ["café", ["x", "y"]], "kwargs": {}}
    assert message.body == json.dumps(expected, ensure_ascii=False, separators=(",", ":")).encode()
    assert message.headers["NServiceBus.ContentType"] == "application/json"
    assert result.args == expected["args"] and add.get_result(result.id).args == expected["args"]


def test_arguments_and_results_are_normalised_as_the_framework_does(tasks_on_sluice, pump_for):
    """Tuples become lists and UTF-8 bytes text, at enqueue and in the stored result, as the
    framework's TaskResult normalises them."""
    from tests.task_funcs import add

    text = add.enqueue(b"ab", "c")
    lists = add.enqueue(("a", "b"), ["c"])
    assert text.args == ["ab", "c"] and lists.args == [["a", "b"], ["c"]]
    run_all(pump_for, tasks_on_sluice)
    assert add.get_result(text.id).return_value == "abc"
    assert add.get_result(lists.id).return_value == ["a", "b", "c"]


def test_system_checks(tasks_on_sluice):
    assert list(tasks_on_sluice.backend.check()) == []
    bad = {"default": {"BACKEND": "core.tasks.backend.SluiceTaskBackend", "QUEUES": ["no spaces"],
                       "OPTIONS": {"DATABASE": "nowhere", "COLOUR": "red"}}}
    with override_settings(TASKS=bad):
        from core.tasks.framework import task_backends

        ids = sorted(m.id for m in task_backends["default"].check())
    assert ids == ["sluice.E021", "sluice.E022", "sluice.E024"]
    assert all(isinstance(m, checks.CheckMessage) for m in tasks_on_sluice.backend.check())


def test_workers_serve_sluice_backends_beside_one_that_cannot_load(tasks_on_sluice):
    """Another TASKS backend whose package this worker lacks is not Sluice's to serve: the
    task handler still registers on Sluice's queues (the framework's check names the other)."""
    from core.handlers import HandlerRegistry
    from core.tasks.worker import register

    from django.conf import settings

    with override_settings(TASKS={**settings.TASKS, "elsewhere": {"BACKEND": "not.installed.Backend"}}):
        assert register(HandlerRegistry()) == [tasks_on_sluice.queue]


def test_setup_creates_the_task_queues(tasks_on_sluice):
    from core.queues import delete_queue, registry
    from core.setup import setup_infrastructure

    delete_queue(tasks_on_sluice.queue)
    registry.forget()
    made = dict(setup_infrastructure())
    assert tasks_on_sluice.queue in made


def test_old_finished_results_are_pruned(tasks_on_sluice, pump_for):
    from core.tasks.retention import prune_results
    from tests.task_funcs import add

    done, waiting = add.enqueue(1, 1), add.using(run_after=dt.datetime.now(dt.timezone.utc)
                                                + dt.timedelta(hours=1)).enqueue(2, 2)
    run_all(pump_for, tasks_on_sluice)
    assert prune_results() == 0  # within the retention
    time.sleep(0.05)
    assert prune_results(retention=0) == 1
    assert not TaskResultRecord.objects.filter(pk=done.id).exists()
    assert TaskResultRecord.objects.filter(pk=waiting.id).exists()  # READY: kept


def test_a_task_that_raises_among_others_counts_one_failed_attempt(tasks_on_sluice, pump_for):
    """The worker runs a chunk's tasks in one batch call; the one that raised is not run
    again by the pump's one-message re-call, so its failed run is one counted attempt."""
    from tests import task_funcs
    from tests.task_funcs import add

    task_funcs.FAIL_NEXT["among"] = 1
    before = add.enqueue(1, 2)
    flaky = task_funcs.flaky.enqueue("among")
    after = add.enqueue(3, 4)
    run_all(pump_for, tasks_on_sluice, immediate_retries=2)
    done = task_funcs.flaky.get_result(flaky.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"key": "among", "attempt": 2}
    assert done.attempts == 2 and len(done.errors) == 1
    assert [add.get_result(r.id).return_value for r in (before, after)] == [3, 7]
    assert add.get_result(before.id).attempts == 1 and add.get_result(after.id).attempts == 1
    assert list(PingRecord.objects.filter(message_id__startswith="among-").values_list("message_id", flat=True)) \
        == ["among-2"]
