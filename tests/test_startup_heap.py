"""A web server process, and a ``sluice worker`` process, settle their start-up heap
(core.startup.settle_heap) before they serve: Django's modules, models, URL patterns and views are frozen out of the garbage
collector's full collections, which otherwise paused the monitoring tab for 150 ms every
ten or so requests."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

PROBE = ("import gc; import sluice.wsgi; import django.urls; "
         "print(gc.get_freeze_count(), 'dashboard.views.monitoring' in sys.modules)")


def test_the_wsgi_app_loads_its_urls_and_freezes_what_start_up_made(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "sluice.settings", "DJANGO_DEBUG": "0",
           "DJANGO_SECRET_KEY": "a-test-only-key-" + "x" * 40,
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    result = subprocess.run([sys.executable, "-c", "import sys; " + PROBE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    frozen, views_loaded = result.stdout.split()
    assert int(frozen) > 10_000 and views_loaded == "True"


WORKER_PROBE = ("import gc, django; django.setup(); from django.core.management import call_command; "
                "call_command('sluice', 'setup'); "
                "call_command('sluice', 'worker', '--queue', 'demo', '--until-empty', '--no-mover'); "
                "print(gc.get_freeze_count())")


def test_the_worker_freezes_what_start_up_made_before_it_serves(tmp_path):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "sluice.settings", "DJANGO_DEBUG": "0",
           "DJANGO_SECRET_KEY": "a-test-only-key-" + "x" * 40,
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"}
    result = subprocess.run([sys.executable, "-c", WORKER_PROBE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 10_000
