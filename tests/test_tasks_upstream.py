"""Django's own tests of ``django.tasks`` (tests/tasks/ in Django's source, BSD 3-clause,
Copyright (c) Django Software Foundation and individual contributors) run against Sluice's
backend: tests/upstream_tasks_support.py takes them from the running Django's source
distribution; none of their code is copied here.  Each class below is one of Django's test
classes with TASKS pointing at Sluice's backend and real queues behind it; the tests that
cannot apply to a real queueing backend are skipped here, each with its reason.

- Django's TaskTestCase (the Task API, against its DummyBackend there) and DummyBackendTestCase
  (a backend that enqueues without running) run on ``SluiceTaskBackend``: enqueue leaves the
  task READY in its queue, and ``get_result`` reads the row back.
- Django's ImmediateBackendTestCase (enqueue runs the task to its end) runs on
  ``DrainingSluiceBackend``: Sluice's enqueue, then a real pump drains the queue (the task
  handler, the failure hook, the error queue), then ``get_result``.

Only on Django 6 (django.tasks): the backport's source distribution ships no tests.
"""
from __future__ import annotations

import sys
import unittest
import uuid

import pytest
from django.test import TransactionTestCase, override_settings

from core.handlers import handlers
from core.queues import create_queue, delete_queue
from core.tasks.framework import FRAMEWORK

if FRAMEWORK != "django.tasks":
    pytest.skip("Django's tests of django.tasks need Django 6 (this is the backport on Django "
                f"{__import__('django').get_version()}; the backport ships no tests)", allow_module_level=True)

from tests.upstream_tasks_support import upstream_tests  # noqa: E402

try:
    _where = str(upstream_tests())
except RuntimeError as exc:  # no network and no copy in var/upstream: said, not passed
    pytest.skip(str(exc), allow_module_level=True)
if _where not in sys.path:
    sys.path.append(_where)

from tasks import test_dummy_backend, test_immediate_backend, test_tasks  # noqa: E402

SLUICE = "core.tasks.backend.SluiceTaskBackend"
DRAINING = "tests.upstream_tasks_support.DrainingSluiceBackend"


class OnSluiceQueues(TransactionTestCase):
    """Sluice's queues for the class's TASKS (a prefix of its own), the task handler on them
    and the error queue; dropped after each test, before the test database is flushed."""

    databases = {"default"}

    def setUp(self) -> None:
        from core.tasks.worker import register

        create_queue("error", kind="error")
        self.sluice_queues = register()
        for queue in self.sluice_queues:
            create_queue(queue)

    def tearDown(self) -> None:
        from core.tasks.backend import TASK_MESSAGE_TYPE

        for queue in self.sluice_queues:
            handlers.unregister(queue, TASK_MESSAGE_TYPE)
            delete_queue(queue)
        delete_queue("error")


def sluice_tasks(backend: str, queues: list[str], **others: dict) -> dict:
    prefix = f"up{uuid.uuid4().hex[:6]}_"
    return {"default": {"BACKEND": backend, "QUEUES": queues, "OPTIONS": {"QUEUE_PREFIX": prefix}}, **others}


def not_here(reason: str):
    """A test of Django's replaced by a skip saying why it does not apply to Sluice's backend."""
    @unittest.skip(f"not for Sluice's backend: {reason}")
    def skipped(self) -> None:
        """Never runs."""

    return skipped


PRIORITY = ("Sluice's backend refuses a non-default priority (supports_priority is False: docs/tasks.md, "
            "'Priorities'), and the Task's using() asks the backend")


@override_settings(TASKS=sluice_tasks(SLUICE, ["default", "queue_1"],
                                      immediate={"BACKEND": "django.tasks.backends.immediate.ImmediateBackend",
                                                 "QUEUES": []},
                                      missing={"BACKEND": "does.not.exist"}))
class TestDjangoTaskTestCaseOnSluice(test_tasks.TaskTestCase, OnSluiceQueues):
    setUp = OnSluiceQueues.setUp  # Django's clears the DummyBackend's in-memory results

    test_using_correct_backend = not_here("asserts TASKS' default is Django's DummyBackend")
    test_get_backend = not_here("asserts TASKS' default is Django's DummyBackend")
    test_enqueue_task = not_here("reads the DummyBackend's in-memory results list (the result's "
                                 "fields are checked by DummyBackendTestCase's tests here)")
    test_enqueue_task_async = not_here("reads the DummyBackend's in-memory results list")
    test_using_priority = not_here(PRIORITY)
    test_chained_using = not_here(PRIORITY)
    test_invalid_priority = not_here(PRIORITY + " (the range check itself is the framework's)")


@override_settings(TASKS=sluice_tasks(SLUICE, ["default"]))
class TestDjangoDummyBackendTestCaseOnSluice(test_dummy_backend.DummyBackendTestCase, OnSluiceQueues):
    setUp = OnSluiceQueues.setUp

    test_using_correct_backend = not_here("asserts the backend is Django's DummyBackend")
    test_enqueue_task = not_here("reads the DummyBackend's in-memory results list")
    test_enqueue_task_async = not_here("reads the DummyBackend's in-memory results list")
    test_refresh_result = not_here("changes a result in the DummyBackend's memory (a run changing it: "
                                   "ImmediateBackendTestCase's tests here, and tests/test_tasks_backend.py)")
    test_refresh_result_async = not_here("changes a result in the DummyBackend's memory")
    test_clear = not_here("DummyBackend.clear() forgets its results; Sluice prunes them by age instead "
                          "(tests/test_tasks_backend.py: test_old_finished_results_are_pruned)")
    test_validate_on_enqueue = not_here("re-configures TASKS to Django's DummyBackend, so it tests that one "
                                        "(the same refusal on Sluice's: TaskTestCase's test_unknown_queue_name)")
    test_validate_on_aenqueue = not_here("re-configures TASKS to Django's DummyBackend")


@override_settings(TASKS=sluice_tasks(DRAINING, ["default"]))
class TestDjangoImmediateBackendTestCaseOnSluice(test_immediate_backend.ImmediateBackendTestCase, OnSluiceQueues):
    test_using_correct_backend = not_here("asserts the backend is Django's ImmediateBackend with no OPTIONS")
    test_catches_exception = not_here(
        "its second case raises SystemExit in the task, which the ImmediateBackend records as the task's "
        "failure; Sluice's pump lets SystemExit out (its receive transaction rolls back, the message stays "
        "queued). The ValueError case's path is test_complex_exception's and test_failed_logs' here")
    test_throws_keyboard_interrupt = not_here(
        "expects KeyboardInterrupt out of enqueue(); Sluice's pump lets it out too, but in a worker's "
        "thread, not the enqueuing caller's")
    test_cannot_get_result = not_here("the ImmediateBackend keeps no results; Sluice's are in a table")
    test_cannot_refresh_result = not_here("the ImmediateBackend keeps no results; Sluice's are in a table")
    test_cannot_pass_run_after = not_here("the ImmediateBackend cannot defer; Sluice's delays through its "
                                          "delayed store (tests/test_tasks_backend.py)")
    test_validate_on_enqueue = not_here("re-configures TASKS to Django's ImmediateBackend, so it tests that one")
    test_validate_on_aenqueue = not_here("re-configures TASKS to Django's ImmediateBackend")
