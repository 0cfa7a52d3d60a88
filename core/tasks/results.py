"""Task results: the ``sluice_task_result`` row ↔ the framework's ``TaskResult``, each
attempt's record, and the retention.

Every time is the database's: ``enqueued_at`` is the INSERT's ``db_default``, and an
attempt reads the database's now with its row (one SELECT), so the times of results
written by different hosts compare.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import socket
import time
import traceback
from typing import Any

from django.db import connections
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from core.db import StatementCursor, database_now_us
from core.dialects import Dialect, dialect_for
from core.dialects.tasks_sql import TASK_ROWS_PER_UPDATE
from core.models import TaskResultRecord, TaskStatus
from core.tasks.framework import Task, TaskError, TaskResult, TaskResultStatus, normalize_json

#: This process in ``worker_ids`` (the framework allows 64 characters).
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"[-64:]


def json_value(value: Any) -> Any:
    """``value`` as it will come back from the database's JSON (TypeError when it cannot be):
    the framework's normalising (tuples become lists, UTF-8 bytes text; its "Unsupported
    type" error otherwise), then a round trip through the json module."""
    try:
        return json.loads(json.dumps(normalize_json(value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"not JSON: {exc}") from None


@functools.lru_cache(maxsize=1024)
def task_at(path: str) -> Task:
    """The task a worker runs: the module-level ``@task`` object at ``path`` (imported once
    per process).  ImportError / TypeError when there is none: the message fails and, after
    its retries, waits in the error queue for a deploy that has it."""
    found = import_string(path)
    if not isinstance(found, Task):
        raise TypeError(f"{path} is not a task (declare it with @task)")
    return found


#: What enqueue writes in a READY row; the rest are the columns' defaults (NULL times, and
#: ``enqueued_at``, the database's clock, returned by the INSERT).
READY_COLUMNS = ("id", "task_path", "backend", "queue_name", "priority", "args_kwargs", "run_after")
#: ... and what every READY row has, written into the statement (three parameters fewer).
READY_LITERALS = {"status": f"'{TaskStatus.READY.value}'", "errors": "'[]'", "worker_ids": "'[]'"}


@functools.lru_cache(maxsize=None)
def _insert_ready_sql(dialect: Dialect) -> str:
    return dialect.insert_returning(TaskResultRecord._meta.db_table, READY_COLUMNS, "enqueued_at", READY_LITERALS)


def ready_row(using: str, result_id: str, task: Task, backend: str, args_kwargs_json: str) -> tuple[str, list[Any]]:
    """The INSERT of a task's READY result row and its parameters, built once per dialect
    (the ORM's create compiled its SQL anew each time, half of an enqueue); it returns
    ``enqueued_at`` as the database writes it (:func:`enqueued_at`).  The backend runs it
    with the task's message (Transport.send_along: one round trip where the database can)."""
    connection = connections[using]
    run_after = task.run_after
    if run_after is not None:  # as the ORM stores a DateTimeField on this database
        run_after = connection.ops.adapt_datetimefield_value(run_after)
    return _insert_ready_sql(dialect_for(connection)), [
        result_id, task.module_path, backend, task.queue_name, task.priority, args_kwargs_json, run_after]


def enqueued_at(using: str, row: tuple[Any, ...]) -> dt.datetime:
    """``enqueued_at`` from the row :func:`ready_row`'s INSERT returned."""
    return dialect_for(connections[using]).to_datetime(row[0])


# A chunk's read and update of result rows are planned at each run, never prepared: a
# prepared statement's generic plan is made once (at its sixth run) for the table as it
# was then: a worker started beside an empty result table kept a sequential scan of the
# whole table for each chunk (24 ms per 100 tasks at 20,000 rows: the database's CPU per
# task doubled) until an ANALYZE replanned it.  Planning anew costs microseconds a chunk.
# tests/test_tasks_plans.py holds this.


def read_results(using: str, ids: list[str]) -> list[tuple[str, dt.datetime, dt.datetime | None, list, list, dt.datetime]]:
    """A chunk's result rows: (id, enqueued_at, started_at, errors, worker_ids, the
    database's now), in one statement.  Not prepared (see above)."""
    dialect = dialect_for(connections[using])
    with StatementCursor(using) as cursor:
        raw = cursor.execute(*dialect.task_results_read(TaskResultRecord._meta.db_table, ids),
                             prepare=False).fetchall()
    return [(rid, dialect.to_datetime(enqueued), dialect.to_datetime(started), _json(errors), _json(worker_ids),
             dialect.to_datetime(now)) for rid, enqueued, started, errors, worker_ids, now in raw]


def _json(value: Any) -> Any:
    """A JSON column's value as the driver gave it: decoded already (jsonb), or text."""
    if value == "[]":  # a new task's errors and worker ids: no parse
        return []
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def write_successes(using: str, started: dt.datetime, finished: dt.datetime,
                    rows: list[tuple[str, str, str | None]]) -> None:
    """Successful attempts of one chunk, in one UPDATE per TASK_ROWS_PER_UPDATE rows: each
    ``(id, worker_ids JSON, return_value JSON or None)``, all started at ``started`` (the
    database's now as their rows were read) and finished at ``finished``."""
    connection = connections[using]
    dialect = dialect_for(connection)
    table = TaskResultRecord._meta.db_table
    times = [TaskStatus.SUCCESSFUL.value, *(connection.ops.adapt_datetimefield_value(t)
                                             for t in (started, started, finished))]
    with StatementCursor(using) as cursor:
        for first in range(0, len(rows), TASK_ROWS_PER_UPDATE):
            cursor.execute(*dialect.task_results_update(table, times, rows[first:first + TASK_ROWS_PER_UPDATE]),
                           prepare=False)


#: The framework's TaskResult fields and their defaults (``_return_value``'s among them).
_RESULT_FIELDS = tuple((f.name, f.default) for f in dataclasses.fields(TaskResult))
RESULT_FIELD_NAMES = tuple(name for name, _ in _RESULT_FIELDS)


def json_result(**values: Any) -> TaskResult:
    """A TaskResult whose arguments came from JSON (so are normalised already): the
    constructor without its ``__post_init__``, which would normalise them again (a tenth of
    an enqueue, a fifth of a task's time in the worker)."""
    result = object.__new__(TaskResult)
    for name, default in _RESULT_FIELDS:
        value = values.get(name, default)
        if value is dataclasses.MISSING:
            raise TypeError(f"TaskResult needs {name}")
        object.__setattr__(result, name, value)
    return result


def ready_result(task: Task, result_id: str, backend: str, enqueued_at: dt.datetime,
                 args_kwargs: dict[str, Any]) -> TaskResult:
    """The framework's value of a task just enqueued (what to_task_result makes of its row);
    ``args_kwargs`` as read back from their JSON."""
    return json_result(task=task, id=result_id, status=TaskResultStatus.READY, enqueued_at=enqueued_at,
                       started_at=None, finished_at=None, last_attempted_at=None, args=args_kwargs["args"],
                       kwargs=args_kwargs["kwargs"], backend=backend, errors=[], worker_ids=[])


def exception_path(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def to_task_result(record: TaskResultRecord, task: Task | None = None) -> TaskResult:
    """The framework's value for a stored result (the task imported by its path unless given)."""
    task = task or task_at(record.task_path)
    if task.queue_name != record.queue_name:
        task = task.using(queue_name=record.queue_name)
    args_kwargs = record.args_kwargs or {}
    result = TaskResult(
        task=task, id=record.id, status=TaskResultStatus(record.status), enqueued_at=record.enqueued_at,
        started_at=record.started_at, finished_at=record.finished_at, last_attempted_at=record.last_attempted_at,
        args=args_kwargs.get("args", []), kwargs=args_kwargs.get("kwargs", {}), backend=record.backend,
        errors=[TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                for e in record.errors or []],
        worker_ids=list(record.worker_ids or []))
    # The framework's frozen dataclass keeps the value in a field its constructor does not take.
    object.__setattr__(result, "_return_value", record.return_value)
    return result


class Attempt:
    """One attempt of a task on a worker, inside the receive's transaction: the row read
    with the database's now, counted as an attempt of this worker, then saved once with its
    outcome (which commits, or rolls back, with the task's own database work)."""

    def __init__(self, result_id: str, using: str, body: dict[str, Any]) -> None:
        self.using = using
        found = (TaskResultRecord.objects.using(using).filter(pk=result_id)
                 .annotate(db_now=Now()).first())
        if found is None:
            # No row: enqueued by an older release or by hand, or pruned while waiting in the
            # error queue.  The run is recorded all the same.
            found = TaskResultRecord(id=result_id, task_path=body["task"], backend=body.get("backend", "default"),
                                     queue_name=body.get("queue_name", "default"),
                                     args_kwargs={"args": body.get("args", []), "kwargs": body.get("kwargs", {})})
            self.now = _database_now(using)
            self.new = True
        else:
            self.now = found.db_now
            self.new = False
        self.record = found
        self._started = time.monotonic()
        found.status = TaskStatus.RUNNING
        found.started_at = found.started_at or self.now
        found.last_attempted_at = self.now
        found.worker_ids = [*(found.worker_ids or []), WORKER_ID]

    def elapsed(self) -> dt.datetime:
        """The database's now at the attempt's start plus the time it took."""
        return self.now + dt.timedelta(seconds=time.monotonic() - self._started)

    def succeeded(self, value: Any) -> None:
        r = self.record
        r.status, r.finished_at, r.return_value = TaskStatus.SUCCESSFUL, self.elapsed(), value
        self._save()

    def failed(self, exc: BaseException, final: bool) -> None:
        """A failed attempt: READY again while Sluice retries it, FAILED once it went to the
        error queue (an operator's Retry makes it READY again when it runs)."""
        r = self.record
        r.errors = [*(r.errors or []), {"exception_class_path": exception_path(exc),
                                        "traceback": "".join(traceback.format_exception(exc))}]
        r.status = TaskStatus.FAILED if final else TaskStatus.READY
        r.finished_at = self.elapsed() if final else None
        r.return_value = None
        self._save()

    def _save(self) -> None:
        if self.new:
            self.record.save(using=self.using, force_insert=True)
            self.new = False
        else:
            self.record.save(using=self.using, update_fields=[
                "status", "started_at", "finished_at", "last_attempted_at", "errors", "worker_ids",
                "return_value"])


def _database_now(using: str) -> dt.datetime:
    return dt.datetime.fromtimestamp(database_now_us(using) / 1_000_000, tz=dt.timezone.utc)
