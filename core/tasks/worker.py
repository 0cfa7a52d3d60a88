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

Signals: ``task_started`` before each attempt; ``task_finished`` once the task reached
SUCCESSFUL or FAILED (not after an attempt that Sluice will retry).
"""
from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from core.handlers import HandlerRegistry, handlers
from core.messages import Message
from core.tasks.backend import TASK_MESSAGE_TYPE, SluiceTaskBackend
from core.tasks.framework import TaskContext, task_backends, task_finished, task_started
from core.tasks.results import Attempt, json_value, task_at, to_task_result

log = logging.getLogger("sluice.tasks")


def run_task(message: Message, context: Any) -> None:
    """Run the task a message names (imported by its path), sync or async, with its
    TaskContext when it takes one; record the attempt's outcome in its result row."""
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
        task_finished.send(sender=type(task.get_backend()), task_result=to_task_result(attempt.record, task))


def sluice_backends() -> list[SluiceTaskBackend]:
    """The backends of Django's TASKS setting that are Sluice's."""
    found = []
    for alias in getattr(settings, "TASKS", None) or {}:
        backend = task_backends[alias]
        if isinstance(backend, SluiceTaskBackend):
            found.append(backend)
    return found


def register(registry: HandlerRegistry = handlers) -> list[str]:
    """The task handler and failure hook on every queue of every Sluice task backend (called
    by core.handlers.load_handler_modules on each worker and by `sluice setup`, which then
    creates the queues), in the process's registry unless given another.  Returns the queues."""
    queues = sorted({queue for backend in sluice_backends() for queue in backend.sluice_queues()})
    for queue in queues:
        registry.register(queue, TASK_MESSAGE_TYPE, run_task)
        registry.on_failure(queue, TASK_MESSAGE_TYPE, record_failure)
    return queues
