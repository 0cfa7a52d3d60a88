"""Sluice in a project of one's own, following docs/django-project.md word for word: the
snippets (settings, URLs, model, handler, view) and the commands are taken from the page
itself, so the page cannot drift from the code.

A project made by ``django-admin startproject`` in a fresh virtualenv with the built wheel
(no extras); its settings are startproject's plus the page's lines.  Then, as a new user
would: migrate, ``sluice setup``, a user, a send from a view inside ``transaction.atomic()``
(and one whose block rolls back: never sent), ``sluice worker``, the handler's row, a login
to the dashboard under ``/ops/``, and every API read answering 401 to a stranger.  On
SQLite, on PostgreSQL, and once more behind a path prefix (``SCRIPT_NAME``, as a reverse
proxy sets it) with the page's single sign-on settings and a whole login through an
OpenID Connect provider on 127.0.0.1.  Also: a project with a ``core`` package of its own,
and the checks a project's settings can fail.
"""
from __future__ import annotations

import http.cookiejar
import re
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.celery_support import Proc, RedisServer, free_port
from tests.conftest import ROOT, database_url, wait_for
from tests.install_support import build_wheel, clean_env, installed_venv, run
from tests.oidc_provider import CLIENT_ID, CLIENT_SECRET, OIDCProvider

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "django-project.md"
#: Every read of the JSON API (GET), by path below the dashboard's mount point.
API_READS = ("api/queues/", "api/queues/orders/messages/?bodies=1", "api/delayed/", "api/failed/",
             "api/failed/groups/", "api/operations/", "api/conversations/?q=x", "api/outbox/", "api/audit/",
             "api/metrics/", "api/monitoring/", "api/monitoring/orders/", "api/alerts/", "api/alerts/rules/",
             "api/alerts/targets/", "api/alerts/silences/", "api/alerts/deliveries/", "api/alerts/export/",
             "api/schema/")


# -- the page --------------------------------------------------------------------------------------

def snippets() -> dict[str, str]:
    """Each titled code block of the page, by title (```python title="shop/views.py")."""
    text = PAGE.read_text()
    return {title: code for title, code in re.findall(r'```\w+ title="([^"]+)"\n(.*?)```', text, re.S)}


def page_commands() -> list[str]:
    """The commands of the page's "shell" block, in order."""
    return [line[2:].strip() for line in snippets()["shell"].splitlines() if line.startswith("$ ")]


# -- a project ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    return installed_venv(build_wheel(tmp_path_factory))


@pytest.fixture
def redis():
    server = RedisServer().start()
    yield server
    server.stop()


class Project:
    """A startproject project in ``home`` run with the venv's commands."""

    def __init__(self, venv: Path, home: Path, redis: RedisServer, **env: str) -> None:
        self.home = home
        self.env = clean_env(PATH=f"{venv / 'bin'}:{clean_env()['PATH']}", **env)
        self.redis = redis
        self.procs: list[Proc] = []

    def sh(self, command: str, *, input: str | None = None, check: bool = True, timeout: float = 180):
        """A command as the page writes it (``python manage.py …``, ``sluice …``)."""
        return run(["bash", "-c", command], cwd=self.home, env=self.env, check=check, timeout=timeout, input=input)

    def write(self, path: str, text: str, append: bool = False) -> None:
        target = self.home / path
        target.write_text((target.read_text() if append else "") + "\n" + text)

    def start(self, name: str, command: str, **env: str) -> Proc:
        proc = Proc(name, ["bash", "-c", f"exec {command}"], {**self.env, **env}, cwd=self.home)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()


def make_project(venv: Path, home: Path, redis: RedisServer, database: str | None = None,
                 sso: OIDCProvider | None = None) -> Project:
    """startproject + startapp, then the page's files; ``database``: a DATABASES entry for
    PostgreSQL (the page's lines are for startproject's SQLite); ``sso``: the page's single
    sign-on settings too, pointed at this provider."""
    project = Project(venv, home, redis)
    page = PAGE.read_text()
    for command in ("django-admin startproject mysite .", "python manage.py startapp shop"):
        assert f"$ {command}" in page, f"the page no longer says {command!r}"
        project.sh(command)
    parts = snippets()
    project.write("mysite/settings.py", parts["mysite/settings.py (add at the end)"], append=True)
    if sso is not None:
        project.write("mysite/settings.py", "\n" + parts["mysite/settings.py (single sign-on)"], append=True)
    for name in ("mysite/urls.py", "shop/models.py", "shop/handlers.py", "shop/views.py", "shop/urls.py"):
        project.write(name, parts[name])
    # The test's own lines, after the page's: a Redis of its own, the database under test.
    extra = f"\nSLUICE_REDIS_URL = {redis.url!r}\n"
    if database:
        extra += f"DATABASES = {{'default': {database}}}\n"
    if sso is not None:
        extra += (f"SLUICE_OIDC_ISSUER = {sso.issuer!r}\nSLUICE_OIDC_CLIENT_ID = {CLIENT_ID!r}\n"
                  f"SLUICE_OIDC_CLIENT_SECRET = {CLIENT_SECRET!r}\n")
    project.write("mysite/settings.py", extra, append=True)
    return project


def postgres_settings(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return repr({"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                 "USER": urllib.parse.unquote(parts.username or ""),
                 "PASSWORD": urllib.parse.unquote(parts.password or ""),
                 "HOST": parts.hostname or "127.0.0.1", "PORT": str(parts.port or 5432)})


# -- a browser of sorts --------------------------------------------------------------------------------

class Browser:
    """Cookies kept, redirects followed, the CSRF token sent as Django asks."""

    def __init__(self) -> None:
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def open(self, url: str, data: dict[str, str] | None = None) -> tuple[int, str, str, dict[str, str]]:
        headers = {}
        token = next((c.value for c in self.cookies if c.name == "csrftoken"), None)
        if token:
            headers["X-CSRFToken"] = token
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        request = urllib.request.Request(url, data=body, headers=headers)
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, response.geturl(), response.read().decode(errors="replace"), \
                    dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.geturl(), exc.read().decode(errors="replace"), dict(exc.headers)


def answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


# -- the page, followed ------------------------------------------------------------------------------------

def follow_the_page(project: Project, prefix: str = "", sso: OIDCProvider | None = None) -> dict[str, float]:
    """Everything the page says, in its order; returns how long the steps took."""
    times: dict[str, float] = {}
    started = time.monotonic()
    check = project.sh("python manage.py check")
    assert "ERRORS" not in check.stdout + check.stderr, check.stdout + check.stderr

    commands = page_commands()
    worker_command = next(c for c in commands if c.startswith("sluice worker"))
    password = secrets.token_urlsafe(16)
    for command in commands:
        if command == worker_command:
            break
        project.sh(command, input=password + "\n" if "--password-stdin" in command else None)
    times["to_set_up"] = time.monotonic() - started

    port = free_port()
    project.start("web", f"gunicorn mysite.wsgi --bind 127.0.0.1:{port} --workers 1",
                  **({"SCRIPT_NAME": prefix} if prefix else {}))
    site = f"http://127.0.0.1:{port}{prefix}"
    wait_for(lambda: answers(f"{site}/ops/accounts/login/"), timeout=60, what="gunicorn to answer")

    # The dashboard: to its own login page (under the prefix), then in.
    operator = Browser()
    status, url, page, _ = operator.open(f"{site}/ops/")
    assert status == 200 and urllib.parse.urlsplit(url).path == f"{prefix}/ops/accounts/login/", (status, url)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    status, url, page, _ = operator.open(url, {"csrfmiddlewaretoken": token, "username": "alice",
                                               "password": password, "next": f"{prefix}/ops/"})
    assert status == 200 and urllib.parse.urlsplit(url).path == f"{prefix}/ops/", (status, url, page[:500])
    assert "orders" in page and "alice" in page
    # The icon: every page links it, and /favicon.ico under the dashboard leads to it, prefix kept.
    assert f'<link rel="icon" href="{prefix}/static/dashboard/favicon.svg"' in page
    _, url, _, _ = operator.open(f"{site}/ops/favicon.ico")
    assert urllib.parse.urlsplit(url).path == f"{prefix}/static/dashboard/favicon.svg", url
    if sso is not None:  # a whole single sign-on: to the provider and back, under the prefix
        sso.log_in_as("olga", groups=["sluice-operator"])
        status, url, page, _ = Browser().open(f"{site}/ops/accounts/sso/login/?next={prefix}/ops/")
        assert status == 200 and urllib.parse.urlsplit(url).path == f"{prefix}/ops/", (status, url, page[:500])
        assert "olga" in page and ">operator<" in page

    # The view: an order and its message commit together; one that rolls back sends nothing.
    status, _, body, _ = operator.open(f"{site}/shop/orders/", {"item": "tea", "quantity": "2"})
    assert status == 201, body
    status, _, body, _ = operator.open(f"{site}/shop/orders/", {"item": "anvils", "quantity": "20"})
    assert status == 409, body
    times["to_first_send"] = time.monotonic() - started

    # A stranger: every API read is a 401 that names the token scheme.
    stranger = Browser()
    for path in API_READS:
        status, _, body, headers = stranger.open(f"{site}/ops/{path}")
        assert status == 401 and headers.get("WWW-Authenticate") == "Token", (path, status, body[:200])

    project.sh(f"{worker_command} --until-empty", timeout=180)
    times["to_first_handled"] = time.monotonic() - started
    orders = project.sh('python manage.py shell -c "from shop.models import Order; '
                        'print(sorted((o.item, o.confirmed) for o in Order.objects.all()))"').stdout.strip().splitlines()[-1]
    assert orders == "[('tea', True)]", orders
    return times


@pytest.mark.no_database
def test_a_new_project_on_sqlite_follows_the_page(venv, tmp_path, redis, record_property):
    project = make_project(venv, tmp_path, redis)
    try:
        times = follow_the_page(project)
    finally:
        project.stop()
    record_property("seconds", times)
    print(f"startproject to the first handled message: {times}")


@pytest.mark.no_database
def test_a_new_project_behind_a_path_prefix(venv, tmp_path, redis):
    """With the page's single sign-on settings, against a provider on 127.0.0.1."""
    with OIDCProvider() as provider:
        project = make_project(venv, tmp_path, redis, sso=provider)
        try:
            follow_the_page(project, prefix="/intranet", sso=provider)
        finally:
            project.stop()


@pytest.mark.postgresql
def test_a_new_project_on_postgresql_follows_the_page(venv, tmp_path, redis, monkeypatch):
    from benchmarks.common import bench_database

    # A database of its own on the suite's server, made and dropped around the test.
    monkeypatch.setenv("SLUICE_BENCH_POSTGRES_URL", database_url().rsplit("/", 1)[0] + "/postgres")
    with bench_database("postgresql", name="sluice_own_project") as url:
        project = make_project(venv, tmp_path, redis, database=postgres_settings(url))
        try:
            follow_the_page(project)
        finally:
            project.stop()


# -- what a project can get wrong ---------------------------------------------------------------------

@pytest.mark.no_database
def test_a_project_with_its_own_core_package_is_told_at_start(venv, tmp_path, redis):
    project = make_project(venv, tmp_path, redis)
    # startapp refuses the name once Sluice is installed; a project that had its own core
    # before installing Sluice has this:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text('"""The project\'s own core app."""\n')
    result = project.sh("python manage.py check", check=False)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "sluice.E010" in out and str(tmp_path / "core") in out, out[-2000:]
    assert "ModuleNotFoundError" not in out, out[-2000:]


@pytest.mark.no_database
def test_wrong_setting_types_and_missing_pieces_are_check_errors_naming_them(venv, tmp_path, redis):
    project = make_project(venv, tmp_path, redis)
    settings = "mysite/settings.py"
    project.write(settings, '\nSLUICE_HANDLER_MODULES = "shop.handlers"\n', append=True)
    out = project.sh("python manage.py check", check=False)
    assert "sluice.E002" in out.stderr and "SLUICE_HANDLER_MODULES must be a list or tuple of strings" in out.stderr, \
        out.stderr[-2000:]

    project.write(settings, '\nSLUICE_HANDLER_MODULES = ["shop.handlers"]\n'
                            'SLUICE_CONCURRENCY = "8"\n', append=True)
    out = project.sh("python manage.py check", check=False)
    assert "SLUICE_CONCURRENCY must be a whole number" in out.stderr, out.stderr[-2000:]

    project.write(settings, '\nSLUICE_CONCURRENCY = 8\n'
                            'INSTALLED_APPS.remove("django_htmx")\n'
                            'MIDDLEWARE.remove("django.contrib.messages.middleware.MessageMiddleware")\n'
                            'TEMPLATES[0]["APP_DIRS"] = False\n'
                            'DATABASES["default"]["OPTIONS"] = {}\n'
                            'del SLUICE_REDIS_URL\n', append=True)
    out = project.sh("python manage.py check", check=False)
    text = out.stdout + out.stderr
    for wanted in ('sluice.E011', 'add "django_htmx" to INSTALLED_APPS', "sluice.E012",
                   'add "django.contrib.messages.middleware.MessageMiddleware" to MIDDLEWARE', "sluice.E013",
                   '"APP_DIRS": True', "sluice.E001", "transaction_mode", "sluice.W002", "SLUICE_REDIS_URL",
                   "sluice.W010", "dashboard.timeouts.StatementTimeoutMiddleware", "sluice.W011"):
        assert wanted in text, (wanted, text[-3000:])


@pytest.mark.no_database
def test_the_sluice_command_says_which_settings_it_could_not_load(venv, tmp_path, redis):
    project = make_project(venv, tmp_path, redis)
    result = project.sh("DJANGO_SETTINGS_MODULE=nosuch.settings sluice status", check=False)
    assert result.returncode == 2
    assert "cannot import the settings module 'nosuch.settings' (from DJANGO_SETTINGS_MODULE)" in result.stderr
    assert "Traceback" not in result.stderr
    # From the project's directory, with nothing set: the project's own settings (manage.py's).
    status = project.sh("sluice setup")
    assert "orders" in status.stdout + status.stderr


@pytest.mark.no_database
def test_celery_runs_in_the_project_it_is_started_in(venv, tmp_path, redis):
    project = make_project(venv, tmp_path, redis)
    project.sh("sluice setup")
    worker = project.start("celery", "celery -A workers worker --pool=threads -c 1 --loglevel=info "
                                     "--without-mingle --without-gossip")
    try:
        worker.wait_line(r"Django settings: mysite\.settings \(from .*manage\.py\)", timeout=90)
        worker.wait_line(r"@\S+ ready\.", timeout=90)
    finally:
        project.stop()


@pytest.mark.no_database
def test_sluice_outside_any_project_makes_the_folder_of_its_sqlite_file(venv, tmp_path, redis):
    """No project here: the bundled one, whose default database is var/sluice.sqlite3 under
    the current directory; a fresh directory has no var/, which setup now makes."""
    empty = tmp_path / "fresh"
    empty.mkdir()
    project = Project(venv, empty, redis, REDIS_URL=redis.url)
    result = project.sh("sluice setup")
    assert (empty / "var" / "sluice.sqlite3").is_file(), result.stdout + result.stderr
