"""The tasks benchmark's no-op task (benchmarks/tasks.py), imported by its path by both
backends' workers: Sluice's and django-tasks-db's ``db_worker``.  Nothing of Sluice is
imported here: django-tasks-db's worker runs in a project without Sluice."""
from __future__ import annotations

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop(i: int) -> None:
    return None
