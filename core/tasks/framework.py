"""Django's Tasks framework, wherever this Django has it: ``django.tasks`` (Django 6.0 and
later) or the ``django-tasks`` backport (Django 5.2, the ``tasks`` extra).  The rest of
core.tasks imports the framework from here only.

Where both exist (the backport installed on Django 6) ``django.tasks`` wins: the backend
is then a ``django.tasks`` backend, and tasks must be declared with ``django.tasks.task``.
"""
from __future__ import annotations

from importlib.util import find_spec

if find_spec("django.tasks") is not None:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (DEFAULT_TASK_PRIORITY, Task, TaskContext, TaskError, TaskResult,
                                   TaskResultStatus)
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
else:  # Django 5.2 with the backport (ImportError without it: install sluice[tasks])
    from django_tasks import task_backends  # type: ignore[no-redef]
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (DEFAULT_TASK_PRIORITY, Task, TaskContext, TaskError,  # type: ignore[no-redef]
                                   TaskResult, TaskResultStatus)
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import task_enqueued, task_finished, task_started  # type: ignore[no-redef]
    from django_tasks.utils import normalize_json  # type: ignore[no-redef]

    FRAMEWORK = "django_tasks"

__all__ = ["BaseTaskBackend", "DEFAULT_TASK_PRIORITY", "FRAMEWORK", "InvalidTaskError", "Task", "TaskContext",
           "TaskError", "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "task_backends",
           "task_enqueued", "task_finished", "task_started"]
