"""Without the ``pipeline`` extra (pyspark, pyarrow): the pipeline commands say what to
install and exit non-zero without a traceback; the rest of Sluice imports and runs.

The dev venv has the packages, so a subprocess hides them: a sitecustomize.py on
PYTHONPATH makes importing them fail the way a missing package does."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HIDE = '''
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "pyarrow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
'''
@pytest.fixture(scope="module")
def without_extra(tmp_path_factory):
    site = tmp_path_factory.mktemp("hide-pipeline-extra")
    (site / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "PYTHONPATH": str(site), "DJANGO_SETTINGS_MODULE": "sluice.settings",
           "DATABASE_URL": f"sqlite:///{site / 'unused.sqlite3'}"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    return run


@pytest.mark.no_database
@pytest.mark.parametrize("command", [["pipeline", "run"], ["records", "export"], ["pipeline", "load", "x"]])
def test_the_pipeline_commands_say_what_to_install(without_extra, command):
    done = without_extra("manage.py", "sluice", *command)
    assert done.returncode != 0
    assert 'pip install "django-sluice[pipeline]"' in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.no_database
def test_everything_else_imports_and_the_package_command_works(without_extra, tmp_path):
    check = without_extra("-c", "import django; django.setup()\n"
                          "import core.receive.pump, core.records.run, core.cli.records, dashboard.urls, dashboard.views.charts, "
                          "workers.tasks\n"
                          "from dashboard.views.charts import pipeline_missing\n"
                          "print(pipeline_missing())\n"
                          "try:\n    import pyspark\nexcept ImportError:\n    print('hidden')\n")
    assert check.returncode == 0, check.stderr
    assert 'pyspark and pyarrow not installed: pip install "django-sluice[pipeline]"' in check.stdout
    assert "hidden" in check.stdout
    built = without_extra("manage.py", "sluice", "pipeline", "package", str(tmp_path))
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "sluice-pipeline.zip").exists() and "--py-files" in built.stdout


def test_a_queued_run_without_the_extra_fails_with_the_reason(transactional_db, monkeypatch):
    """The dashboard's "run now" queues a run row first: it must end failed, with what to
    install, not stay queued (the charts page polls while a run is queued)."""
    from core.records.extra import PipelineExtraMissing
    from core.models.records import PipelineRun
    from core.records.run import run_pipeline

    queued = PipelineRun.objects.create(trigger="web")
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    with pytest.raises(PipelineExtraMissing):
        run_pipeline(run_id=queued.pk)
    queued.refresh_from_db()
    assert queued.status == "failed" and 'pip install "django-sluice[pipeline]"' in queued.error
