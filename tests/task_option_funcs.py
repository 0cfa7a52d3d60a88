"""Tasks declared with Sluice's own per-task options (core.tasks.backend.SluiceTask), for
tests/test_tasks_options.py: imported only where TASKS' default is Sluice's backend, whose
task class takes the options (``@task`` asks the backend's ``task_class`` at declaration)."""
from __future__ import annotations

from core.tasks.framework import TaskContext

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task(takes_context=True)
def fails(context: TaskContext) -> None:
    raise RuntimeError(f"attempt {context.attempt} fails")


@task(takes_context=True, immediate_retries=1)
def fails_retried_once(context: TaskContext) -> None:
    raise RuntimeError(f"attempt {context.attempt} fails")


@task(immediate_retries=0, delayed_retries=1)
def fails_into_a_delayed_retry() -> None:
    raise RuntimeError("fails")


@task(ttl=0.5)
def short_lived(n: int) -> int:
    return n
