"""Django's own tests of its Tasks framework (tests/tasks/ in Django's source), run against
Sluice's backend by tests/test_tasks_upstream.py: a test suite nobody here wrote.

Django's wheel does not ship its tests; its source distribution on the package index does.
The tests of the running Django's version are taken from it once (``pip download``), into
var/upstream/django-<version>/ (only ``tests/tasks/`` and Django's LICENSE: the tests are
Django's, under its BSD 3-clause licence, and are not copied into this repository), then
imported as the package ``tasks``, the name Django's own runner gives them (their
``module_path`` assertions expect ``tasks.tasks.noop_task``).

The backport (``django-tasks``, Django 5.2) ships no tests in its source distribution, so on
Django 5.2 there is nothing to run: the module says so and skips.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import django

from core.receive.pump import MessagePump
from core.tasks.backend import SluiceTaskBackend
from tests.conftest import ROOT, drain

UPSTREAM = ROOT / "var" / "upstream"


def upstream_tests(version: str = django.get_version()) -> Path:
    """The directory holding Django ``version``'s ``tasks`` test package (downloaded once).
    RuntimeError, saying why, when the source distribution cannot be had."""
    home = UPSTREAM / f"django-{version}"
    if (home / "tests" / "tasks" / "test_tasks.py").is_file():
        return home / "tests"
    UPSTREAM.mkdir(parents=True, exist_ok=True)
    sdist = UPSTREAM / f"django-{version}.tar.gz"
    if not sdist.is_file():
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
             "--no-binary", ":all:", f"django=={version}", "-d", str(UPSTREAM)],
            capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"could not download Django {version}'s source distribution: "
                               f"{done.stderr.strip()[-500:]}")
    prefix = f"django-{version}/"
    wanted = (f"{prefix}tests/tasks/", f"{prefix}LICENSE")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted) and (m.isfile() or m.isdir())]
        tar.extractall(UPSTREAM, members=members, filter="data")
    if not (home / "tests" / "tasks" / "test_tasks.py").is_file():
        raise RuntimeError(f"Django {version}'s source distribution has no tests/tasks/test_tasks.py")
    return home / "tests"


class DrainingSluiceBackend(SluiceTaskBackend):
    """Sluice's backend whose ``enqueue`` then runs a worker's pump over the task's queue until
    it is empty, and returns the result as ``get_result`` reads it: Django's tests of its
    ImmediateBackend (enqueue runs the task to its end) asked of the real thing, with the
    enqueue, the task handler, the retries' end in the error queue and the result row all
    Sluice's.  No immediate or delayed retries: a failure is final at once, as there."""

    def enqueue(self, task, args, kwargs):
        result = super().enqueue(task, args, kwargs)
        pump = MessagePump(self.sluice_queue(task.queue_name), using=self.using, concurrency=1,
                           peek_delay=0.05, immediate_retries=0, delayed_retries=0)
        try:
            drain(pump)
        finally:
            pump.close()
        return self.get_result(result.id)
