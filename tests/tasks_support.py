"""Fixtures for Django tasks on Sluice: TASKS naming Sluice's backend with queues of the
test's own (a QUEUE_PREFIX per test), the task handler registered, the queues created."""
from __future__ import annotations

import uuid

import pytest
from django.test import override_settings

from core.handlers import handlers
from core.queues import create_queue, delete_queue


class TaskSetup:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.queue = f"{prefix}default"

    @property
    def backend(self):
        from core.tasks.framework import task_backends

        return task_backends["default"]


@pytest.fixture
def tasks_on_sluice(transactional_db, error_queue):
    """Sluice's backend as TASKS' default, on queue ``<prefix>default`` (created, dropped after)."""
    from core.tasks.backend import TASK_MESSAGE_TYPE
    from core.tasks.worker import register

    prefix = f"t{uuid.uuid4().hex[:8]}_"
    tasks = {"default": {"BACKEND": "core.tasks.backend.SluiceTaskBackend", "QUEUES": ["default"],
                         "OPTIONS": {"QUEUE_PREFIX": prefix}}}
    with override_settings(TASKS=tasks):
        setup = TaskSetup(prefix)
        create_queue(setup.queue)
        import tests.task_funcs  # noqa: F401  (declared against this TASKS)
        assert register() == [setup.queue]
        try:
            yield setup
        finally:
            handlers.unregister(setup.queue, TASK_MESSAGE_TYPE)
            try:
                delete_queue(setup.queue)
            except Exception:
                pass
