"""A clean install, the way users and the Docker image install Sluice: the wheel, built from
this tree, in a fresh virtualenv with no extras (and again with ``[pipeline]``), run from a
directory that is not the checkout.  The test suite's own venv has every extra installed, so
only here does a run-time import that no dependency declares show up (kombu's Redis transport
needs ``packaging``, which nothing declared: the Celery worker of a plain install died).

The venvs are kept under var/clean-install/, keyed on the wheel's contents (its RECORD: the
hash of every file), so a second run with unchanged code reuses them: building one takes
about 15 s (base) and 40 s ([pipeline], PySpark from pip's cache).

Runs in one pass of ``make test`` (no_database: its own SQLite file, its own Redis).
"""
from __future__ import annotations

import http.client
import json
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.celery_support import Proc, RedisServer, free_port
from tests.install_support import build_wheel, clean_env, installed_venv, run
from tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.no_database, pytest.mark.slow]

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory)


@pytest.fixture(scope="module")
def base_venv(wheel) -> Path:
    return installed_venv(wheel)


@pytest.fixture(scope="module")
def pipeline_venv(wheel) -> Path:
    return installed_venv(wheel, "pipeline")


class Site:
    """An installed Sluice run from a directory of its own, on a SQLite file there and a Redis of its own."""

    def __init__(self, venv: Path, home: Path, redis: RedisServer) -> None:
        self.bin = venv / "bin"
        self.home = home
        self.env = clean_env(
            DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
            DJANGO_ALLOWED_HOSTS="127.0.0.1",
            DATABASE_URL=f"sqlite:///{home}/sluice.sqlite3",
            REDIS_URL=redis.url,
            # A failing handler goes straight to the error queue, and beat ingests it within a
            # second: the message's whole path in a few seconds.
            SLUICE_IMMEDIATE_RETRIES="0",
            SLUICE_DELAYED_RETRIES="0",
            SLUICE_INGEST_INTERVAL="1",
            SLUICE_PEEK_DELAY="0.2",
            SLUICE_DEMO_TRAFFIC="0",
            PYSPARK_PYTHON=str(venv / "bin" / "python"),
        )
        self.procs: list[Proc] = []

    def sluice(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return run([str(self.bin / "sluice"), *args], cwd=self.home, env=self.env, check=check, timeout=timeout)

    def start(self, name: str, *argv: str) -> Proc:
        proc = Proc(name, [str(self.bin / argv[0]), *argv[1:]], self.env, cwd=self.home)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def base_site(base_venv, tmp_path, redis):
    site = Site(base_venv, tmp_path, redis)
    yield site
    site.stop()


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def answers(port: int, path: str) -> tuple[int, str] | None:
    try:
        return get(port, path)
    except OSError:
        return None


# -- the tests -----------------------------------------------------------------------------------

def test_the_installed_package_is_the_wheel_and_knows_its_version(base_site):
    where = run([str(base_site.bin / "python"), "-c", "import sluice; print(sluice.__file__)"],
                cwd=base_site.home, env=base_site.env).stdout.strip()
    assert where.startswith(str(base_site.bin.parent)), where
    version = base_site.sluice("--version").stdout.strip()
    from sluice import __version__
    assert version == __version__
    assert run([str(base_site.bin / "python"), "-m", "sluice", "--version"],
               cwd=base_site.home, env=base_site.env).stdout.strip() == __version__


def test_base_install_serves_the_dashboard_and_handles_messages_with_celery(base_site):
    site = base_site
    # As the Docker image and docker-compose.yml run it: a manage.py alone in the run
    # directory (python manage.py ...), and the sluice command (sluice manage ...).
    shutil.copy(ROOT / "manage.py", site.home)
    run([str(site.bin / "python"), "manage.py", "migrate", "--noinput"], cwd=site.home, env=site.env)
    run([str(site.bin / "python"), "manage.py", "sluice", "setup"], cwd=site.home, env=site.env)
    site.sluice("manage", "collectstatic", "--noinput", "-v0")
    assert (site.home / "var" / "static").is_dir(), "collectstatic wrote somewhere else than the run directory"

    port = free_port()
    site.start("web", "gunicorn", "-c", "python:sluice.gunicorn_conf", "--bind", f"127.0.0.1:{port}",
               "sluice.wsgi")
    status, page = wait_for(lambda: answers(port, "/accounts/login/"), timeout=60, what="gunicorn to answer")
    assert status == 200, page
    assert 'name="password"' in page
    css = next(part.split('"')[0] for part in page.split('href="/static/')[1:] if ".css" in part.split('"')[0])
    assert get(port, f"/static/{css}")[0] == 200

    worker = site.start("worker", "celery", "-A", "workers", "worker", "--pool=threads", "-c", "2",
                        "--loglevel=info", "--without-mingle", "--without-gossip")
    worker.wait_line(r"@\S+ ready\.", timeout=90)
    site.start("beat", "celery", "-A", "workers", "beat", "-s", str(site.home / "beat-schedule"),
               "--loglevel=info").wait_line(r"beat: Starting", timeout=60)

    # Ping: handled by the worker's pump.  Fail: handled, fails, goes to the error queue,
    # and beat's ingest task (run by the worker) makes it a failed message.
    site.sluice("send", "demo", "--type", "Ping", "--body", "{}")
    site.sluice("send", "demo", "--type", "Fail", "--body", "{}")

    def failed() -> list:
        listed = json.loads(site.sluice("failed", "list", "--json").stdout)
        return listed if isinstance(listed, list) else listed.get("failed") or listed.get("messages") or []

    wait_for(failed, timeout=60, interval=0.5, what="the Fail message as a failed message (worker + beat)")
    assert json.loads(site.sluice("peek", "demo", "--json").stdout) in ([], {"messages": []})

    status = site.sluice("status", "--check", check=False)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Traceback" not in worker.text, worker.tail()


def test_base_install_says_what_to_install_for_the_pipeline(base_site):
    site = base_site
    site.sluice("setup")
    result = site.sluice("pipeline", "run", check=False, timeout=60)
    assert result.returncode != 0
    assert "django-sluice[pipeline]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# Installing PySpark into a fresh venv (this test's fixture) and a first Spark run took more
# than the default 300 s together on a loaded 2-core machine.
@pytest.mark.timeout(900)
def test_pipeline_install_runs_the_pipeline(pipeline_venv, tmp_path, redis):
    site = Site(pipeline_venv, tmp_path, redis)
    site.env.update(SLUICE_RECORDS_EXPORT_DELAY="0", SLUICE_SPARK_MASTER="local[1]", SLUICE_SPARK_DRIVER_MEMORY="1g")
    site.sluice("setup")
    for _ in range(3):
        site.sluice("send", "demo", "--type", "Ping", "--body", "{}")
    site.sluice("worker", "--queue", "demo", "--until-empty", "--no-mover", timeout=120)

    result = site.sluice("pipeline", "run", "--json", timeout=300)
    run_summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert run_summary["exported"] == 3, result.stdout
    assert run_summary["windows"] >= 1, result.stdout
