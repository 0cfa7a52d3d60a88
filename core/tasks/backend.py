"""Sluice's backend for Django's Tasks framework.

    TASKS = {"default": {"BACKEND": "core.tasks.backend.SluiceTaskBackend", "QUEUES": ["default", "emails"]}}

``enqueue`` writes two rows through the caller's connection, inside its transaction (in
one round trip on PostgreSQL and SQL Server): the task's message in the Sluice queue
named like the task's ``queue_name`` (``OPTIONS`` ``QUEUE_PREFIX`` before it, if set)
and its result row (READY).  A block that rolls back
takes both with it: the task never runs and has no result.  ``run_after`` goes through
Sluice's delayed store, due by the database's clock.  Workers run it with the task
handler (core.tasks.worker) under Sluice's retries, error queue and failed-message
workflow.  docs/tasks.md is the guide.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from typing import Any, Iterable

from django.apps import apps
from django.core import checks
from django.db import connections, transaction

from core.conf import get_settings
from core.errors import InvalidQueueName, InvalidTTL
from core.messages import Message
from core.models import TaskResultRecord
from core.outgoing import ProducerHeaders, json_text, new_id, producer_headers_checked
from core.queues import validate_name, validate_ttl
from core.tasks.framework import (BaseTaskBackend, InvalidTaskError, Task, TaskResult, TaskResultDoesNotExist,
                                  normalize_json, task_enqueued)
from core.tasks.names import TASK_MESSAGE_TYPE, TASK_PATH_HEADER  # (core.tasks.worker imports them from here)
from core.tasks.results import enqueued_at, ready_result, ready_row, task_at, to_task_result
from core.transport import Transport

#: Tasks whose checks a backend keeps (SluiceTaskBackend._checked); past it, it starts again.
CHECKED_TASKS = 1024
#: OPTIONS the backend reads.
KNOWN_OPTIONS = {"DATABASE", "QUEUE_PREFIX"}
#: The headers that carry a task's own retry counts (SluiceTask) to the worker's recoverability.
IMMEDIATE_RETRIES_HEADER = "Django.Task.ImmediateRetries"
DELAYED_RETRIES_HEADER = "Django.Task.DelayedRetries"


@dataclass(frozen=True, slots=True, kw_only=True)
class SluiceTask(Task):
    """The task class of Sluice's backend (the framework's ``task_class``): ``@task`` takes
    Sluice's per-task options beside the framework's.

    - ``ttl``: seconds (or a timedelta) the task's message may wait to be received; past
      it the message expires unrun (the queue's expiry rules: dropped, or dead-lettered).
      A delayed task's TTL starts when it is due.
    - ``immediate_retries`` / ``delayed_retries``: this task's retry counts, in place of
      SLUICE_IMMEDIATE_RETRIES / SLUICE_DELAYED_RETRIES (the worker's).

    None keeps the default.  ``dataclasses.replace(task, ttl=60)`` makes a variant (the
    framework's ``using()`` knows only its own fields)."""

    ttl: float | dt.timedelta | None = None
    immediate_retries: int | None = None
    delayed_retries: int | None = None

    def sluice_options(self) -> tuple[float | None, dict[str, str]]:
        """The message's TTL in seconds and the headers with the task's retry counts;
        InvalidTaskError naming the option when one is not valid."""
        try:
            ttl = validate_ttl(self.ttl, "ttl")
        except InvalidTTL as exc:
            raise InvalidTaskError(f"task {self.module_path}: {exc}") from None
        if ttl == 0:
            raise InvalidTaskError(f"task {self.module_path}: ttl must be more than 0 seconds (None: no TTL)")
        headers = {}
        for name, header in (("immediate_retries", IMMEDIATE_RETRIES_HEADER),
                             ("delayed_retries", DELAYED_RETRIES_HEADER)):
            count = getattr(self, name)
            if count is None:
                continue
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidTaskError(f"task {self.module_path}: {name} must be a whole number >= 0, not {count!r}")
            headers[header] = str(count)
        return ttl, headers


def task_retry_limits(message: Message) -> tuple[int | None, int | None]:
    """A task message's own retry counts (core.handlers' retry limits), None where it has
    none or the header is not a count (a foreign row: the worker's counts then)."""
    def count(header: str) -> int | None:
        text = message.headers.get(header, "")
        return int(text) if text.isdigit() else None

    return count(IMMEDIATE_RETRIES_HEADER), count(DELAYED_RETRIES_HEADER)


@dataclass(frozen=True, slots=True)
class CheckedTask:
    """What a validated task's messages need (SluiceTaskBackend._checked)."""

    task: Task
    queue: str
    ttl: float | None
    headers: ProducerHeaders
    #: The message body's JSON up to its arguments: ``{"task":…,"backend":…,"queue_name":…,``.
    body_start: str


class TaskArgumentsNotJSON(InvalidTaskError, TypeError):
    """A task's arguments that are not JSON: the framework's InvalidTask(Error), and the
    TypeError ("Unsupported type: ...") its other backends raise for them."""


#: Argument types that JSON gives back as they were: a call whose arguments are all of
#: them needs no normalising and no parse of its JSON (the common case).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def task_arguments(args: Any, kwargs: Any) -> tuple[str, dict[str, Any]]:
    """A task's arguments as the JSON text its result row and its message keep, and as the
    database's JSON will give them back, normalised as the framework's TaskResult does
    (tuples to lists, UTF-8 bytes to text), encoded as ``send()`` encodes a body (so the
    message body is the bytes send() would write); TaskArgumentsNotJSON when they are not
    JSON (NaN and infinities included: no database's JSON takes them)."""
    args, kwargs = list(args), dict(kwargs)
    try:
        # Plain JSON values (the rule) need no normalising: json writes a tuple as a list
        # and refuses whatever normalize_json would change or refuse (bytes, other
        # sequences and mappings), which then takes the long way.
        text = json_text({"args": args, "kwargs": kwargs})
    except (TypeError, ValueError):
        try:
            text = json_text({"args": normalize_json(args), "kwargs": normalize_json(kwargs)})
        except (TypeError, ValueError) as exc:
            raise TaskArgumentsNotJSON(f"task arguments must be JSON: {exc}") from None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: no database's text takes it
            raise TaskArgumentsNotJSON(f"task arguments must be JSON text: {exc}") from None
    if all(type(a) in _PLAIN for a in args) and all(type(v) in _PLAIN for v in kwargs.values()):
        return text, {"args": args, "kwargs": kwargs}
    return text, json.loads(text)


class SluiceTaskBackend(BaseTaskBackend):
    task_class = SluiceTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # A queue table is received in RowVersion order (the NServiceBus layout has no priority
    # column, and a receive that sorted by one could not use the clustered RowVersion
    # order): priority is not honoured, so the framework refuses a non-default one.
    # docs/tasks.md, "Priorities".
    supports_priority = False

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        self.queue_prefix = str(self.options.get("QUEUE_PREFIX", ""))
        self._checked_tasks: dict[Task, CheckedTask] = {}
        self._last_checked: CheckedTask | None = None

    @property
    def using(self) -> str:
        """The database alias of the task queues and results (SLUICE_DATABASE unless OPTIONS
        DATABASE names another): read when used, as settings may change in tests."""
        return self.options.get("DATABASE") or get_settings().DATABASE

    def sluice_queue(self, queue_name: str) -> str:
        """The Sluice queue (table) of a task queue name."""
        return f"{self.queue_prefix}{queue_name}"

    def sluice_queues(self) -> list[str]:
        return [self.sluice_queue(name) for name in sorted(self.queues)]

    # -- enqueue ---------------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if isinstance(task, SluiceTask):
            task.sluice_options()
        try:
            validate_name(self.sluice_queue(task.queue_name))
        except InvalidQueueName as exc:
            raise InvalidTaskError(f"queue {task.queue_name!r}: {exc}") from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        checked = self._checked(task)
        args_kwargs_json, args_kwargs = task_arguments(args, kwargs)
        result_id = new_id()  # a MessageId, time-ordered: the result table's key appends
        using = self.using
        # The body send() would write for {"task": …, "backend": …, "queue_name": …, "args":
        # …, "kwargs": …}, from the arguments' JSON made once for it and the result row.
        body = (checked.body_start + args_kwargs_json[1:]).encode("utf-8")
        along = ready_row(using, result_id, task, self.alias, args_kwargs_json)
        send = functools.partial(Transport(using).send_along, checked.queue, body, along, message_id=result_id,
                                 message_type=TASK_MESSAGE_TYPE, headers=checked.headers, ttl=checked.ttl,
                                 deliver_at=task.run_after, content_type="application/json")
        # Both rows or neither, in the caller's transaction when one is open (no savepoint
        # of our own: a failed insert breaks the caller's block, which then rolls back).
        # One round trip where the database can (Transport.send_along).
        connection = connections[using]
        if connection.in_atomic_block:
            # What atomic(savepoint=False) would do inside the caller's block, without its
            # bookkeeping (a tenth of an enqueue): an error marks the block for rollback.
            try:
                _, row = send()
            except BaseException:
                connection.needs_rollback = True
                raise
        else:
            with transaction.atomic(using=using, savepoint=False):
                _, row = send()
        result = ready_result(task, result_id, self.alias, enqueued_at(using, row), args_kwargs)
        task_enqueued.send(type(self), task_result=result)
        return result

    def _checked(self, task: Task) -> CheckedTask:
        """The task validated (InvalidTaskError otherwise) and what its message needs.  Kept
        per task value, as a task is enqueued many times and its checks (the function's
        signature, its import path) cannot change in between; a task with ``run_after`` (a
        value per enqueue, as a rule) is not kept.  The last one is also kept by identity:
        a loop enqueues one task object, and hashing the frozen dataclass costs more than
        the rest of this lookup."""
        last = self._last_checked
        if last is not None and last.task is task:
            return last
        found = self._checked_tasks.get(task)
        if found is not None:
            self._last_checked = found
            return found
        self.validate_task(task)
        if task_at(task.module_path).func is not task.func:
            # Workers import the task by this path: it must name this very task.
            raise InvalidTaskError(f"{task.module_path} does not name this task at module level")
        ttl, headers = task.sluice_options() if isinstance(task, SluiceTask) else (None, {})
        start = json_text({"task": task.module_path, "backend": self.alias, "queue_name": task.queue_name})
        found = CheckedTask(task=task, queue=self.sluice_queue(task.queue_name), ttl=ttl,
                            headers=producer_headers_checked({TASK_PATH_HEADER: task.module_path, **headers}),
                            body_start=start[:-1] + ",")
        if task.run_after is None:
            if len(self._checked_tasks) >= CHECKED_TASKS:
                self._checked_tasks.clear()
            self._checked_tasks[task] = found
            self._last_checked = found
        return found

    # -- results ---------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        record = TaskResultRecord.objects.using(self.using).filter(pk=str(result_id), backend=self.alias).first()
        if record is None:
            raise TaskResultDoesNotExist(result_id)
        return to_task_result(record)

    # -- checks ----------------------------------------------------------------------
    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from super().check(**kwargs)
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("core"):
            yield checks.Error(f"{where} uses Sluice's backend but Sluice's app is not installed",
                               hint="add 'core.apps.CoreConfig' to INSTALLED_APPS", id="sluice.E020")
        unknown = set(self.options) - KNOWN_OPTIONS
        if unknown:
            yield checks.Error(f"{where} OPTIONS has unknown keys: {', '.join(sorted(unknown))}",
                               hint=f"known: {', '.join(sorted(KNOWN_OPTIONS))}", id="sluice.E021")
        if self.using not in connections.settings:
            yield checks.Error(f"{where} uses database {self.using!r}, which is not in DATABASES", id="sluice.E022")
        if not self.queues:
            yield checks.Error(f"{where} QUEUES is empty: Sluice's backend needs the queues its workers serve",
                               id="sluice.E023")
        for name in sorted(self.queues):
            try:
                validate_name(self.sluice_queue(name))
            except InvalidQueueName as exc:
                yield checks.Error(f"{where} queue {name!r}: {exc}", id="sluice.E024")
        if get_settings().TRANSACTION_MODE == "receive_only":
            yield checks.Warning(
                f"{where}: SLUICE_TRANSACTION_MODE is receive_only, so a task's database work does not "
                "commit with its receive (a task may run twice after a crash)",
                hint="use sends_atomic_with_receive (the default) for exactly-once database work",
                id="sluice.W020")
