"""Production deployment (issue 12), with real processes: `check --deploy` under
SLUICE_ENV=production, servers and workers refusing a published secret key, gunicorn with
WhiteNoise behind the HTTPS settings, JSON log lines, `make run`'s own script serving the
dashboard to a browser, and the compose file."""
from __future__ import annotations

import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.startup import DEVELOPMENT_SECRET_KEY, GENERATE_KEY
from tests.celery_support import Proc, RedisServer, free_port
from tests.conftest import ROOT, start_worker, wait_for
from tests.conftest import manage as manage_on_test_database

PY = sys.executable
KEY = secrets.token_urlsafe(50)
PRODUCTION = {"SLUICE_ENV": "production", "DJANGO_SECRET_KEY": KEY, "DJANGO_ALLOWED_HOSTS": "sluice.example.com"}
#: Every test here but the status check runs its processes on a database of its own
#: (child_env) or none: it runs in one pass of `make test` (tests/conftest.py).
no_database = pytest.mark.no_database
#: Variables this file sets itself: never inherited from the test run's environment.
OWN = ("DJANGO_", "SLUICE_ENV", "SLUICE_LOG_FORMAT", "SLUICE_RUN_DIR", "RUN_ADDR", "DEMO")


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test run's environment without any deployment setting, on a database of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN)}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path}/deploy.sqlite3", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run(argv: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run([PY, "manage.py", *args], env)


# -- settings -------------------------------------------------------------------------------------

@no_database
def test_check_deploy_is_clean_in_production(tmp_path):
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=child_env(tmp_path, **PRODUCTION))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@no_database
def test_check_deploy_flags_what_production_turns_on(tmp_path):
    """Without the switch the same check fails on exactly the HTTPS settings it sets, and
    one setting turned off again in production is reported on its own."""
    development = manage("check", "--deploy", "--fail-level", "WARNING",
                         env=child_env(tmp_path, DJANGO_SECRET_KEY=KEY))
    assert development.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in development.stderr, development.stderr

    no_redirect = manage("check", "--deploy", "--fail-level", "WARNING",
                         env=child_env(tmp_path, **PRODUCTION, DJANGO_SECURE_SSL_REDIRECT="0"))
    assert no_redirect.returncode != 0
    assert re.findall(r"security\.W\d+", no_redirect.stderr) == ["security.W008"], no_redirect.stderr


SETTINGS = ("SECURE_PROXY_SSL_HEADER", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE",
            "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD", "CSRF_TRUSTED_ORIGINS",
            "SECURE_REDIRECT_EXEMPT", "STATIC_ROOT")


def settings_in(tmp_path: Path, **env: str) -> dict:
    code = ("import json, django; django.setup(); from django.conf import settings as s; "
            f"print(json.dumps({{k: getattr(s, k, None) for k in {SETTINGS!r}}}, default=str))")
    result = run([PY, "-c", code], child_env(tmp_path, DJANGO_SETTINGS_MODULE="sluice.settings", **env))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@no_database
def test_https_settings_follow_sluice_env_and_their_own_variables(tmp_path):
    dev = settings_in(tmp_path)
    assert dev["SECURE_PROXY_SSL_HEADER"] is None
    assert not (dev["SECURE_SSL_REDIRECT"] or dev["SESSION_COOKIE_SECURE"] or dev["CSRF_COOKIE_SECURE"])
    assert dev["SECURE_HSTS_SECONDS"] == 0

    prod = settings_in(tmp_path, SLUICE_ENV="production")
    assert prod["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert prod["SECURE_SSL_REDIRECT"] and prod["SESSION_COOKIE_SECURE"] and prod["CSRF_COOKIE_SECURE"]
    assert prod["SECURE_HSTS_SECONDS"] == 365 * 24 * 3600 and prod["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert prod["SECURE_HSTS_PRELOAD"] is False
    assert prod["SECURE_REDIRECT_EXEMPT"] == ["^healthz$", "^metrics$"]

    custom = settings_in(tmp_path, SLUICE_ENV="production", DJANGO_SECURE_PROXY_SSL_HEADER="X-Scheme: https",
                         DJANGO_SECURE_HSTS_SECONDS="60", DJANGO_SECURE_COOKIES="0",
                         DJANGO_CSRF_TRUSTED_ORIGINS="https://ops.example.com,https://b.example.com",
                         DJANGO_STATIC_ROOT=str(tmp_path / "s"))
    assert custom["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_SCHEME", "https"]
    assert custom["SECURE_HSTS_SECONDS"] == 60
    assert not custom["SESSION_COOKIE_SECURE"] and not custom["CSRF_COOKIE_SECURE"]
    assert custom["CSRF_TRUSTED_ORIGINS"] == ["https://ops.example.com", "https://b.example.com"]
    assert custom["STATIC_ROOT"] == str(tmp_path / "s")

    no_header = settings_in(tmp_path, SLUICE_ENV="production", DJANGO_SECURE_PROXY_SSL_HEADER="")
    assert no_header["SECURE_PROXY_SSL_HEADER"] is None


@no_database
@pytest.mark.parametrize("env, error", [
    ({"SLUICE_ENV": "prod"}, "SLUICE_ENV must be one of development, production"),
    ({"SLUICE_LOG_FORMAT": "xml"}, "SLUICE_LOG_FORMAT must be one of text, json"),
    ({"DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, "DJANGO_SECURE_PROXY_SSL_HEADER wants"),
    ({"DJANGO_SECURE_HSTS_SECONDS": "a year"}, "DJANGO_SECURE_HSTS_SECONDS='a year' is not a whole number"),
])
def test_bad_deployment_settings_are_refused_by_name(tmp_path, env, error):
    result = manage("check", env=child_env(tmp_path, DJANGO_SECRET_KEY=KEY, **env))
    assert result.returncode != 0
    assert error in result.stderr


# -- the secret key -------------------------------------------------------------------------------

def entry_points(tmp_path: Path) -> dict[str, tuple[list[str], bool]]:
    """Every way to start a server or worker → (argv, whether its whole stderr is the one line)."""
    return {
        "gunicorn": ([PY, "-m", "gunicorn", "-c", "python:sluice.gunicorn_conf", "--bind", "127.0.0.1:0",
                      "sluice.wsgi"], True),
        # Any WSGI server: here gunicorn without Sluice's config, so the app module refuses.
        "wsgi module": ([PY, "-m", "gunicorn", "--no-control-socket", "--bind", "127.0.0.1:0", "sluice.wsgi"],
                        False),
        "celery worker": ([PY, "-m", "celery", "-A", "workers", "worker", "--pool=threads", "-c", "1"], True),
        "celery beat": ([PY, "-m", "celery", "-A", "workers", "beat", "-s", str(tmp_path / "beat")], False),
        "sluice worker": ([PY, "manage.py", "sluice", "worker"], True),
    }


@no_database
@pytest.mark.parametrize("key", [None, DEVELOPMENT_SECRET_KEY], ids=["unset", "development-value"])
@pytest.mark.parametrize("name", ["gunicorn", "wsgi module", "celery worker", "celery beat", "sluice worker"])
def test_servers_and_workers_refuse_a_published_secret_key(tmp_path, name, key):
    argv, only_line = entry_points(tmp_path)[name]
    env = child_env(tmp_path, REDIS_URL="redis://127.0.0.1:9/0", **({"DJANGO_SECRET_KEY": key} if key else {}))
    result = run(argv, env, timeout=60)
    assert result.returncode != 0, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    refusal = [line for line in lines if "refusing to start" in line]
    assert len(refusal) == 1, result.stderr
    assert "DJANGO_SECRET_KEY" in refusal[0] and GENERATE_KEY in refusal[0]
    assert "Traceback" not in result.stdout + result.stderr
    if only_line:
        assert lines == refusal, result.stderr


@no_database
def test_a_key_of_its_own_or_debug_lets_the_web_app_load(tmp_path):
    """gunicorn --check-config loads the config and the app, then exits: the refusal is not
    a blanket one."""
    argv = [PY, "-m", "gunicorn", "--check-config", "-c", "python:sluice.gunicorn_conf", "sluice.wsgi"]
    assert run(argv, child_env(tmp_path, DJANGO_SECRET_KEY=KEY)).returncode == 0
    debug = run(argv, child_env(tmp_path, DJANGO_DEBUG="1"))
    assert debug.returncode == 0, debug.stderr


# -- gunicorn, WhiteNoise, HTTPS, JSON logs -------------------------------------------------------------

def request(port: int, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Host": "sluice.example.com", **(headers or {})})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (gunicorn's and the worker's
    carry `make run`'s state directory)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().split(") ", 1)[1].split()[0]
        except OSError:
            continue
        if text in argv and state != "Z":
            found.append(argv)
    return found


def answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def json_lines(text: str, allowed: tuple[str, ...] = ()) -> list[dict]:
    """Every non-blank line as JSON; a line that is not is an error unless ``allowed`` matches it."""
    records = []
    for line in text.splitlines():
        if not line.strip() or any(re.search(a, line) for a in allowed):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}\n{text}") from None
    return records


@no_database
def test_gunicorn_in_production_serves_static_files_behind_https_and_logs_json(tmp_path):
    static = tmp_path / "static"
    env = child_env(tmp_path, **PRODUCTION, SLUICE_LOG_FORMAT="json", DJANGO_STATIC_ROOT=str(static))
    collected = manage("collectstatic", "--noinput", "-v0", env=env)
    assert collected.returncode == 0, collected.stderr
    manifest = json.loads((static / "staticfiles.json").read_text())["paths"]
    htmx = next(hashed for name, hashed in manifest.items() if re.fullmatch(r"django_htmx/htmx.*\.min\.js", name))
    assert re.search(r"\.[0-9a-f]{12}\.js$", htmx)

    port = free_port()
    proc = Proc("gunicorn", [PY, "-m", "gunicorn", "-c", "python:sluice.gunicorn_conf", "--bind",
                             f"127.0.0.1:{port}", "sluice.wsgi"], env)
    try:
        wait_for(lambda: answers(port) or not proc.alive, timeout=60, what="gunicorn to listen")
        https = {"X-Forwarded-Proto": "https"}

        plain = request(port, "/")
        assert plain.status == 301 and plain.getheader("Location") == "https://sluice.example.com/"
        health = request(port, "/healthz")  # probes come over plain HTTP: no redirect
        assert health.status in (200, 503)
        assert request(port, "/metrics").status != 301  # nor Prometheus

        page = request(port, "/accounts/login/", https)
        assert page.status == 200
        assert page.getheader("Strict-Transport-Security") == "max-age=31536000; includeSubDomains"
        cookies = page.getheader("Set-Cookie") or ""
        assert "csrftoken=" in cookies and "Secure" in cookies

        asset = request(port, f"/static/{htmx}", {**https, "Accept-Encoding": "gzip"})
        assert asset.status == 200
        assert "immutable" in asset.getheader("Cache-Control") and asset.getheader("Content-Encoding") == "gzip"
        assert request(port, "/static/no-such-file.js", https).status == 404
    finally:
        assert proc.terminate(30) == 0

    records = json_lines(proc.text)
    access = [r for r in records if r["logger"] == "gunicorn.access"]
    assert {(r["path"], r["status"]) for r in access} >= {("/", 301), ("/healthz", health.status),
                                                         (f"/static/{htmx}", 200)}
    assert all(isinstance(r["duration_ms"], float) and r["method"] == "GET" for r in access)
    assert any(r["logger"] == "gunicorn.error" and "Booting worker" in r["message"] for r in records)
    assert any(r["logger"] == "django.request" and r["level"] == "WARNING" for r in records)  # the 404


#: Celery prints these itself, not through logging: its shutdown notice, and its warning
#: against running as root (the tests may run as root; the image runs as user sluice).
# Celery's own warning when it runs as root (as CI does), which the warnings module prints
# with its source line: `_warn_or_raise_security_error(` on Celery 5.7, `warnings.warn(` before.
CELERY_NOTICES = (r"^worker: Warm shutdown", r"SecurityWarning: You're running the worker with superuser",
                  r"^absolutely not recommended!$", r"^Please specify a different user using the --uid option\.$",
                  r"^User information: uid=0 ", r"^  _warn_or_raise_security_error\(",
                  r"^  warnings\.warn\(SecurityWarning\(")


@no_database
def test_celery_worker_and_beat_log_json_lines(tmp_path):
    redis = RedisServer().start()
    env = child_env(tmp_path, DJANGO_SECRET_KEY=KEY, SLUICE_LOG_FORMAT="json", REDIS_URL=redis.url,
                    SLUICE_CELERY_HOST_LOOPS="0")
    worker = Proc("worker", [PY, "-m", "celery", "-A", "workers", "--quiet", "worker", "--pool=threads", "-c", "1",
                             "--loglevel=info", "--without-mingle", "--without-gossip"], env)
    # Beat sends to another Redis database: the task-only worker, on an unmigrated
    # database, must not run what it schedules.
    beat = Proc("beat", [PY, "-m", "celery", "-A", "workers", "--quiet", "beat", "--loglevel=info",
                         "-s", str(tmp_path / "beat")], {**env, "REDIS_URL": redis.url[:-1] + "1"})
    try:
        worker.wait_line(r"ready\.", timeout=60)
        beat.wait_line(r"beat: Starting", timeout=60)
        beat.wait_line(r"Sending due task", timeout=30)  # SLUICE_INGEST_INTERVAL: 5 s
    finally:
        worker.stop()
        beat.stop()
        redis.stop()
    worker_records = json_lines(worker.text, CELERY_NOTICES)
    assert any(r["logger"] == "celery.apps.worker" and r["message"].endswith("ready.") for r in worker_records)
    assert any(r["logger"] == "sluice.celery" for r in worker_records)
    beat_records = json_lines(beat.text)
    assert any(r["logger"] == "celery.beat" and "Sending due task" in r["message"] for r in beat_records)


# -- health checks -----------------------------------------------------------------------------------

def test_status_check_passes_only_while_a_worker_on_this_host_publishes(demo):
    """The compose file's worker health check: `sluice status --check`."""
    redis = RedisServer().start()
    env = {"REDIS_URL": redis.url}
    try:
        nobody = manage_on_test_database("sluice", "status", "--check", env=env)
        assert nobody.returncode != 0
        assert f"no worker on {socket.gethostname()}" in nobody.stderr.decode()

        worker = start_worker("--queue", "demo", env=env)
        try:
            wait_for(lambda: manage_on_test_database("sluice", "status", "--check", env=env).returncode == 0,
                     timeout=30, what="the worker's heartbeat")
            ok = manage_on_test_database("sluice", "status", "--check", env=env)
            assert ok.stdout.decode().strip() == f"ok: 1 worker(s) on {socket.gethostname()}, every loop alive"
            elsewhere = manage_on_test_database("sluice", "status", "--check", "--host", "elsewhere", env=env)
            assert elsewhere.returncode != 0 and "no worker on elsewhere" in elsewhere.stderr.decode()
        finally:
            worker.terminate()
            worker.wait(30)
        down = manage_on_test_database("sluice", "status", "--check", env={"REDIS_URL": "redis://127.0.0.1:9/0"})
        assert down.returncode != 0 and "redis is down" in down.stderr.decode()
    finally:
        redis.stop()


# -- `make run` as a new user runs it -----------------------------------------------------------------------

from tests.browser_support import (  # noqa: E402,F401 — fixtures
    CHROMIUM, NetworkLog, browser_context_args, browser_type_launch_args,
)


@no_database
@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_make_run_serves_the_dashboard_with_its_static_files_and_stops_on_ctrl_c(tmp_path, page):
    """scripts/run.sh (what `make run` runs after the venv set-up) on a fresh state: no key,
    no login, no collected static files.  A browser logs in with the printed credentials and
    finds no failed request; Ctrl-C stops everything and exits 0."""
    redis = RedisServer().start()
    port = free_port()
    run_dir = tmp_path / "run"
    env = child_env(tmp_path, DEMO="0", RUN_ADDR=f"127.0.0.1:{port}", SLUICE_RUN_DIR=str(run_dir),
                    REDIS_URL=redis.url, SLUICE_PY=PY)
    proc = Proc("make-run", ["bash", "scripts/run.sh"], env)
    try:
        url = proc.wait_line(r"Sluice dashboard: (\S+)", timeout=180)[1]
        user = proc.wait_line(r"log in as:\s+(\S+)", timeout=5)[1]
        password = proc.wait_line(r"password:\s+(\S+)", timeout=5)[1]
        assert url == f"http://127.0.0.1:{port}/"

        key_file = run_dir / "secret_key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_text().strip()) >= 50
        assert (run_dir / "admin_password").read_text().strip() == password

        net = NetworkLog(page)
        static: list = []
        page.on("response", lambda r: static.append(r) if "/static/" in r.url else None)

        page.goto(url)
        assert "/accounts/login/" in page.url
        page.get_by_label("User name").fill(user)
        page.get_by_label("Password").fill(password)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(url)
        page.wait_for_load_state("networkidle")
        assert "Sluice" in page.title()

        assert net.failures == []
        assert static, "the page loaded no static files"
        for response in static:
            assert response.status == 200, response.url
            assert re.search(r"\.[0-9a-f]{12}\.(js|css|svg)$", response.url), f"not a cache-busting name: {response.url}"
            assert "immutable" in response.headers.get("cache-control", "")
        assert any("htmx" in r.url for r in static)

        proc.popen.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends
        try:
            # The script's own bound is STOP_TIMEOUT (20 s), then SIGKILL; a loaded machine
            # may add to it.
            code = proc.popen.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError("scripts/run.sh still running 90 s after Ctrl-C; left: "
                                 f"{processes_mentioning(str(run_dir))}\n{proc.tail(200)}") from None
        assert code == 0, proc.tail()
        proc.wait_line(r"\[run\] stopped", timeout=5)
        assert not answers(port)
        assert processes_mentioning(str(run_dir)) == [], "left running after Ctrl-C"
        assert "did not stop within" not in proc.text, proc.tail()
        assert "Traceback" not in proc.text, proc.tail(200)
    finally:
        proc.stop()
        redis.stop()


# -- docker-compose.yml ----------------------------------------------------------------------------

COMPOSE = ROOT / "docker-compose.yml"


@no_database
def test_compose_file_serves_with_gunicorn_and_checks_every_service():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    app_env = services["web"]["environment"]
    assert app_env["SLUICE_ENV"] == "${SLUICE_ENV:-production}"
    assert app_env["DJANGO_SECRET_KEY"].startswith("${DJANGO_SECRET_KEY:?")  # no default key
    assert app_env["DJANGO_ALLOWED_HOSTS"].endswith(",127.0.0.1,web")  # whatever .env says: the probes' host
    assert "gunicorn -c python:sluice.gunicorn_conf" in " ".join(services["web"]["command"])
    assert "runserver" not in COMPOSE.read_text()
    for name in ("web", "worker", "beat", "redis", "mssql"):
        assert services[name]["restart"] == "unless-stopped", name
    for name in ("web", "worker", "beat"):
        assert services[name]["healthcheck"]["test"], name
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    assert services["worker"]["healthcheck"]["test"][-3:] == ["sluice", "status", "--check"]


def compose_unavailable() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on this machine"
    result = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"`docker compose` is not available here: {(result.stderr or result.stdout).strip().splitlines()[0]}"
    return None


@no_database
def test_compose_config_is_valid_and_needs_a_secret_key(tmp_path):
    reason = compose_unavailable()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN)}
    ok = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--format", "json"], cwd=tmp_path,
                        env={**env, "DJANGO_SECRET_KEY": KEY}, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    config = json.loads(ok.stdout)
    assert config["services"]["web"]["environment"]["DJANGO_SECRET_KEY"] == KEY
    assert config["services"]["web"]["environment"]["SLUICE_ENV"] == "production"
    missing = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "DJANGO_SECRET_KEY" in missing.stderr
