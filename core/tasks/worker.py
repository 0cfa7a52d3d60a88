"""The worker side: the handler that runs a task's message, and the failure hook that
records a failed attempt.

The handler runs inside the pump's receive transaction (in the default
``sends_atomic_with_receive`` mode, in the chunk's savepoint), like any handler: the
task's own database work and its result row (SUCCESSFUL, with the return value) commit
with the receive, once.  A task that raises rolls all of that back; Sluice's
recoverability then retries it (immediate, then delayed retries) or moves it to the
error queue, and the failure hook records the attempt (its error and traceback, READY
again or FAILED) in the receive's transaction, after the rollback.  A failed task is a
failed message: the dashboard groups it, and Retry sends it back to run again.

The handler is a batch handler (``run_tasks``): a chunk's tasks in one call, their result
rows read in one SELECT (with the database's now) and written back in one UPDATE, where a
handler per message paid a SELECT and an UPDATE, through the ORM, per task.  A task that
raises fails the call; the pump then calls it again one message at a time (core.handlers),
so each task's failure stays its own.  The task that raised is not run again by that
re-call: its exception is raised again, so every run that raised is one failed attempt,
counted once.  The others of the call do run again: their database work (result rows
included) rolled back with the call and counts once, but their side effects outside the
database and their signals happen again (at least once, as for any handler whose chunk
rolls back).

Signals: ``task_started`` before each attempt; ``task_finished`` once the task reached
SUCCESSFUL or FAILED (not after an attempt that Sluice will retry), after its row is written.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from typing import Any


from django.conf import settings
from django.utils.module_loading import import_string

from core.handlers import BatchContext, HandlerRegistry, handlers
from core.messages import Message
from core.tasks.backend import TASK_MESSAGE_TYPE, SluiceTaskBackend, task_retry_limits
from core.tasks.framework import (Task, TaskContext, TaskError, TaskResult, TaskResultStatus, normalize_json,
                                  task_backends, task_finished, task_started)
from core.tasks.results import (RESULT_FIELD_NAMES, WORKER_ID, Attempt, json_result, json_value, read_results, task_at,
                                to_task_result, write_successes)

log = logging.getLogger("sluice.tasks")

#: A first attempt's worker_ids, as JSON (the common case: no dump per task).
ONE_WORKER_JSON = json.dumps([WORKER_ID])
#: Per pump thread: the exception each task raised in the last call of several messages,
#: by (id of the Message object, message id), for the pump's one-message re-call (module doc).
_raised = threading.local()


def run_tasks(messages: list[Message], context: BatchContext) -> None:
    """The tasks of a chunk's messages, one after the other, in the chunk's savepoint: one
    SELECT of their result rows, one UPDATE with their outcomes (module doc)."""
    if len(messages) == 1:
        earlier = getattr(_raised, "by_message", {}).pop((id(messages[0]), messages[0].id), None)
        if earlier is not None:
            raise earlier
    else:
        _raised.by_message = {}
    using = context.using
    ids = [m.id for m in messages]
    rows = {row[0]: row for row in read_results(using, ids)}
    if not rows:  # none has a result row (run_task's doc): the one-message path
        for message in messages:
            run_task(message, context.for_message(message))
        return
    now = next(iter(rows.values()))[5]  # the attempts' start: the database's clock
    read = time.monotonic()
    tasks: dict[tuple[str, str], tuple[Task, type]] = {}  # (path, queue name) → task and sender, once a call
    done: list[tuple[TaskResult, Any, type]] = []
    written: list[tuple[str, str, str | None]] = []
    for message in messages:
        row = rows.get(message.id)
        if row is None:
            run_task(message, context.for_message(message))
            continue
        body = message.json()
        key = (body["task"], body.get("queue_name", ""))
        found = tasks.get(key)
        if found is None:
            task = task_at(key[0])
            if key[1] and task.queue_name != key[1]:
                task = task.using(queue_name=key[1])
            found = tasks[key] = (task, type(task.get_backend()))
        task, sender = found
        _, enqueued_at, started_at, errors, worker_ids, _ = row
        result = json_result(  # (the message's arguments, read from its JSON body)
            task=task, id=message.id, status=TaskResultStatus.RUNNING, enqueued_at=enqueued_at,
            started_at=started_at or now, finished_at=None, last_attempted_at=now,
            args=body.get("args", []), kwargs=body.get("kwargs", {}), backend=body.get("backend", "default"),
            errors=[TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
                    for e in errors or []],
            worker_ids=[*(worker_ids or []), WORKER_ID])
        task_started.send(sender=sender, task_result=result)
        try:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs) \
                if task.takes_context else task.call(*result.args, **result.kwargs)
        except Exception as exc:
            if len(messages) > 1:
                _raised.by_message[(id(message), message.id)] = exc
            raise
        try:
            text = None if value is None else json.dumps(normalize_json(value))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"task {task.module_path} returned a value that is not JSON: {exc}") from None
        wids = result.worker_ids
        written.append((message.id, ONE_WORKER_JSON if wids == [WORKER_ID] else json.dumps(wids), text))
        done.append((result, None if text is None else json.loads(text), sender))
    if not done:
        return
    finished = now + dt.timedelta(seconds=time.monotonic() - read)
    write_successes(using, now, finished, written)
    for result, value, sender in done:
        task_finished.send(sender=sender, task_result=succeeded(result, finished, value))


def succeeded(result: TaskResult, finished: dt.datetime, value: Any) -> TaskResult:
    """``result`` (RUNNING) as SUCCESSFUL at ``finished`` with its return value: a copy, as
    ``dataclasses.replace`` makes, without normalising its arguments a second time."""
    fields = {name: getattr(result, name) for name in RESULT_FIELD_NAMES}
    return json_result(**{**fields, "status": TaskResultStatus.SUCCESSFUL, "finished_at": finished,
                          "_return_value": value})


def run_task(message: Message, context: Any) -> None:
    """Run the task a message names (imported by its path), sync or async, with its
    TaskContext when it takes one; record the attempt's outcome in its result row, made
    now when there is none (enqueued by an older release or by hand, or pruned while its
    message waited in the error queue)."""
    body = message.json()
    task = task_at(body["task"])
    attempt = Attempt(message.id, context.using, body)
    result = to_task_result(attempt.record, task)
    sender = type(task.get_backend())
    task_started.send(sender=sender, task_result=result)
    args, kwargs = result.args, result.kwargs
    # Task.call runs a coroutine function to completion on this thread (async_to_sync): its
    # database calls through sync_to_async come back to this thread, so they join the
    # receive's transaction like a sync task's.
    value = task.call(TaskContext(task_result=result), *args, **kwargs) if task.takes_context \
        else task.call(*args, **kwargs)
    try:
        value = json_value(value)
    except TypeError as exc:
        raise TypeError(f"task {task.module_path} returned a value that is not JSON: {exc}") from None
    attempt.succeeded(value)
    task_finished.send(sender=sender, task_result=to_task_result(attempt.record, task))


def record_failure(message: Message, exc: BaseException, outcome: str, using: str) -> None:
    """The failure hook: one failed attempt, recorded after its work rolled back."""
    body = message.json()
    attempt = Attempt(message.id, using, body)
    final = outcome == "error"
    attempt.failed(exc, final)
    if final:
        try:
            task = task_at(attempt.record.task_path)
        except Exception:  # the task itself cannot be imported: no TaskResult to send
            return
        finished = to_task_result(attempt.record, task)
        # Sent while the exception is being handled, as the framework's own backends do: its
        # log receiver then logs the FAILED task with the exception and its traceback.
        try:
            raise exc
        except BaseException:
            task_finished.send(sender=type(task.get_backend()), task_result=finished)


def sluice_backends() -> list[SluiceTaskBackend]:
    """The backends of Django's TASKS setting that are Sluice's.  Only those are loaded: a
    backend of another kind that cannot be imported (its package missing on this worker) is
    not Sluice's to serve, and the framework's own check names it."""
    found = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            kind = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(kind, type) and issubclass(kind, SluiceTaskBackend):
            found.append(task_backends[alias])
    return found


def register(registry: HandlerRegistry = handlers) -> list[str]:
    """The task handler and failure hook on every queue of every Sluice task backend (called
    by core.handlers.load_handler_modules on each worker and by `sluice setup`, which then
    creates the queues), in the process's registry unless given another.  Returns the queues."""
    queues = sorted({queue for backend in sluice_backends() for queue in backend.sluice_queues()})
    for queue in queues:
        registry.register(queue, TASK_MESSAGE_TYPE, run_tasks, batch=True)
        registry.on_failure(queue, TASK_MESSAGE_TYPE, record_failure)
        registry.on_retry_limits(queue, TASK_MESSAGE_TYPE, task_retry_limits)
    return queues
