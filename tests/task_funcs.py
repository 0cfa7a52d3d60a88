"""Tasks for tests/test_tasks_backend.py and the model-based test, declared with the
framework's own ``@task`` (imported once TASKS names Sluice's backend: tests/tasks_support.py)."""
from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async

from core.demo.models import PingRecord
from core.tasks.framework import TaskContext

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef]

#: Keys whose next N attempts fail (the test sets them; the task reads them).
FAIL_NEXT: dict[str, int] = {}


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def record_ping(key: str) -> str:
    """Database work that must commit with the receive, once."""
    PingRecord.objects.create(message_id=key)
    return key


@task(takes_context=True)
def flaky(context: TaskContext, key: str) -> dict:
    """Fails while FAIL_NEXT[key] > 0; its database work rolls back with each failure."""
    PingRecord.objects.create(message_id=f"{key}-{context.attempt}")
    if FAIL_NEXT.get(key, 0) > 0:
        FAIL_NEXT[key] -= 1
        raise ValueError(f"{key} fails on attempt {context.attempt}")
    return {"key": key, "attempt": context.attempt}


@task()
async def async_double(n: int) -> int:
    await asyncio.sleep(0)
    await sync_to_async(PingRecord.objects.create)(message_id=f"async-{n}")
    return n * 2


@task(takes_context=True)
def model_work(context: TaskContext, k: str, b: str) -> str:
    """The model-based test's task (tests/model_support.py): the Work handler's plan, run as a task."""
    from tests.model_support import task_handlers

    task_handlers().task_work(k, b, context.attempt)
    return k
