"""The docs say what the code does.  Each test pins a claim of a documentation page to the code
it describes, on the real code path: the getting-started page's first handler runs as written,
the JSON API answers as its reference says, the workers page names every task beat schedules,
the deployment page names the image's default extras, and so on.  A test that fails here means
the page or the code moved: fix whichever is wrong."""
from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.test import Client

from core.conf import from_environ
from core.handlers import handlers
from core.models import BulkOperation
from core.queues import delete_queue
from core.transport import Transport
from tests.conftest import ROOT, drain
from tests.dashboard_api_support import api, clean_broker, run_queued  # noqa: F401 — fixtures
from tests.dashboard_pages_support import operator, operator_client  # noqa: F401 — fixtures

no_database = pytest.mark.no_database
DOCS = ROOT / "docs"
FENCE = re.compile(r"```(?P<lang>\w*)[^\n]*\n(?P<code>.*?)```", re.S)


def page(name: str) -> str:
    return (DOCS / name).read_text()


def section(text: str, heading: str) -> str:
    """The text from ``heading`` (a whole line) to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    start = text.index(heading + "\n")
    nxt = re.search(rf"^{level} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + nxt.start()] if nxt else text[start:]


def blocks(text: str, lang: str) -> list[str]:
    return [m.group("code") for m in FENCE.finditer(text) if m.group("lang") == lang]


def sluice(*args: str) -> str:
    out = io.StringIO()
    call_command("sluice", *args, stdout=out)
    return out.getvalue()


# -- getting-started.md: the first handler, run as written ---------------------------------------

@pytest.fixture
def first_handler(tmp_path, transactional_db):
    """The page's handler module written where its words put it (``shop/handlers.py`` in the
    directory sluice runs from: on ``sys.path``), its shell lines, and clean-up of what they make."""
    text = section(page("getting-started.md"), "## A first handler")
    (module,) = [code for code in blocks(text, "python") if code.startswith("# shop/handlers.py\n")]
    (shell,) = blocks(text, "sh")
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "handlers.py").write_text(module)
    sys.path.insert(0, str(tmp_path))
    try:
        yield text, [line.strip() for line in shell.strip().splitlines()]
    finally:
        sys.path.remove(str(tmp_path))
        handlers.unregister("orders", "PlaceOrder")
        for name in [n for n in sys.modules if n == "shop" or n.startswith("shop.")]:
            del sys.modules[name]
        for queue in ("orders", "billing"):
            try:
                delete_queue(queue)
            except Exception:
                pass


def test_the_first_handler_of_getting_started_runs_as_written(first_handler, settings, pump_for):
    text, lines = first_handler
    exports = dict(line.removeprefix("export ").split("=", 1) for line in lines if line.startswith("export "))
    # The key and the database URL are the page's; the test database stands in for the latter.
    assert set(exports) == {"DJANGO_SECRET_KEY", "DATABASE_URL", "SLUICE_HANDLER_MODULES"}
    settings.SLUICE_HANDLER_MODULES = from_environ(exports)["SLUICE_HANDLER_MODULES"]
    commands = [shlex.split(line) for line in lines if not line.startswith("export ")]
    assert [argv[:2] for argv in commands] == [["sluice", "setup"], ["sluice", "queue"], ["sluice", "send"],
                                               ["sluice", "worker"], ["sluice", "peek"]]
    setup, create, send, worker, peek = (argv[1:] for argv in commands)

    assert re.search(r"^(created|exists ) orders$", sluice(*setup), re.M)
    sluice(*create)
    sluice(*send)
    # `sluice worker --queue orders --until-empty`: the pump of that queue, run until it is empty.
    assert worker == ["worker", "--queue", "orders", "--until-empty"]
    drain(pump_for("orders"))
    assert Transport().browse("orders") == []

    shown = sluice(*peek)
    (said,) = re.findall(r"`(\{\"order\".*?\})`", text)  # what the page says peek shows
    assert "BillOrder" in shown and said in shown, shown
    assert peek == ["peek", "billing"] and shown.count("BillOrder") == 1


def test_getting_started_lists_the_system_packages_the_scripts_install():
    installed = set()
    for script in ("scripts/bootstrap.sh", "scripts/services.sh"):
        for line in (ROOT / script).read_text().splitlines():
            found = re.search(r"^\s*(?:if .*then\s*)?apt_install ([\w .+-]+)", line)
            if found:
                installed.update(found.group(1).split())
    assert {"libodbc2", "valgrind", "openjdk-17-jre-headless", "postgresql", "redis-server", "chromium"} <= installed
    text = page("getting-started.md")
    assert sorted(p for p in installed if f"`{p}`" not in text) == []


# -- reference/api.md ------------------------------------------------------------------------------

def test_purge_answers_202_with_an_operation_of_kind_purge(operator_client, queue, clean_broker):
    for _ in range(2):
        Transport().send(queue, "x")
    status, body = api(operator_client, "post", f"/api/queues/{queue}/purge/", {"confirm": queue})
    assert status == 202 and set(body) == {"operation", "count"} and body["count"] == 2
    assert BulkOperation.objects.get(pk=body["operation"]).kind == "purge"
    assert run_queued(body["operation"]).done == 2

    doc = page("reference/api.md")
    (row,) = [line for line in doc.splitlines() if line.startswith("| `POST /api/queues/<name>/purge/`")]
    assert '202 `{"operation": <id>, "count"}`' in row and "purge" in row
    assert '"purged"' not in doc
    assert "`kind` is `retry`, `archive`, `restore` or `purge`" in doc


def test_a_request_without_credentials_gets_401_with_www_authenticate_token(transactional_db):
    response = Client().get("/api/queues/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    message = response.json()["error"]
    doc = page("reference/api.md")
    assert "401 with the header\n`WWW-Authenticate: Token`" in doc and message in doc.replace("\n", " ")
    assert "Without credentials: 403" not in doc


def test_message_bodies_only_with_bodies_1(operator_client, queue):
    Transport().send(queue, {"order": 7})
    _, plain = api(operator_client, "get", f"/api/queues/{queue}/messages/")
    _, full = api(operator_client, "get", f"/api/queues/{queue}/messages/?bodies=1")
    assert plain["messages"][0]["body"] is None and plain["messages"][0]["body_included"] is False
    assert json.loads(full["messages"][0]["body"]) == {"order": 7} and full["messages"][0]["body_included"] is True
    assert "Bodies only with `?bodies=1`" in page("reference/api.md")


@no_database
def test_the_api_reference_links_no_missing_section():
    doc = page("reference/api.md")
    assert "Charts and API" not in doc
    for target, anchor in re.findall(r"\]\(\.\./([\w/.-]+\.md)#([\w-]+)\)", doc):
        headings = re.findall(r"^#+ (.+)$", (DOCS / target).read_text(), re.M)
        assert anchor in {re.sub(r"[^\w]+", "-", h.lower()).strip("-") for h in headings}, (target, anchor)


# -- passwords: --password-stdin, not the deprecated --password --------------------------------

@no_database
def test_the_docs_show_password_stdin_and_call_password_deprecated():
    help_text = subprocess.run([sys.executable, "-m", "sluice", "user", "add", "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=120).stdout
    assert "--password-stdin" in help_text and "deprecated" in help_text
    for name in ("reference/api.md", "operations/dashboard.md", "getting-started.md"):
        text = page(name)
        assert "--password-stdin" in text, name
        for m in re.finditer(r"--password(?![-\w])", text):
            assert "deprecated" in text[max(0, m.start() - 200):m.end() + 200], (name, text[m.start() - 80:m.end() + 40])


# -- operations/workers.md: beat's tasks and who runs each job ---------------------------------

@no_database
def test_every_task_beat_schedules_is_in_the_workers_page(settings):
    from core.maintenance import JOBS, WORKER_JOBS
    from workers.celery import beat_schedule

    # Every optional entry on: pipeline scheduled, no loops in the workers, outbox clean-up on.
    settings.SLUICE_PIPELINE_SCHEDULE = True
    settings.SLUICE_CELERY_HOST_LOOPS = False
    settings.SLUICE_ALERTS_ENABLED = True
    settings.SLUICE_OUTBOX_CLEANUP_INTERVAL = 60.0
    tasks = {entry["task"] for entry in beat_schedule().values()}
    assert "sluice.outbox_cleanup" in tasks
    text = page("operations/workers.md")
    table = section(text, "## Beat schedule")
    assert sorted(t for t in tasks if f"| `{t}` |" not in table) == []
    who = section(text, "## Which process runs each periodic job")
    # Each of the worker's clean-ups (and the outbox's) is named as beat's task of the same job.
    assert sorted(name for name in {*WORKER_JOBS, "outbox_cleanup"} if f"`sluice.{name}`" not in who) == []
    assert set(WORKER_JOBS) | {"outbox_cleanup"} == set(JOBS)
    assert "`--no-maintenance`" in who and "`task:<name>`" in who


# -- deployment.md and docker-compose.yml ---------------------------------------------------------

@no_database
def test_the_deployment_page_names_the_images_default_extras():
    (extras,) = re.findall(r"^ARG EXTRAS=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    docker = section(page("deployment.md"), "## With Docker Compose")
    assert f"by default `{extras}`" in docker


@no_database
def test_the_deployment_page_shows_the_table_settings_sluice_applies():
    from core.dialects.postgresql import TABLE_UPKEEP

    (sql,) = re.findall(r'ALTER TABLE "orders" SET \((.*?)\);', page("deployment.md"), re.S)
    assert dict(re.findall(r"(\w+) = (\w+)", sql)) == dict(TABLE_UPKEEP)


@no_database
def test_the_handlers_page_says_from_how_many_messages_a_batch_is_a_copy():
    from core.dialects.postgresql import PostgreSQLDialect

    (count,) = re.findall(r"one `COPY … FROM STDIN` for (\d+) messages or more", " ".join(page("handlers.md").split()))
    assert int(count) == PostgreSQLDialect.copy_rows_from


@no_database
def test_docker_compose_refers_to_sections_that_exist():
    compose = (ROOT / "docker-compose.yml").read_text()
    refs = re.findall(r'(docs/[\w/.-]+\.md), "?([A-Z][\w ]+?)"?[.)\n}]', compose)
    assert refs and "README" not in compose
    for path, title in refs:
        assert re.search(rf"^#+ {re.escape(title)}$", (ROOT / path).read_text(), re.M), (path, title)


# -- operations/alerts.md: SLUICE_ALERTS_CONFIG is only alerts import's default ------------------

def test_alerts_config_is_only_the_default_of_alerts_import(tmp_path, settings, transactional_db):
    from core.models.alerts import AlertRule

    readers = sorted(str(path.relative_to(ROOT)) for package in ("core", "dashboard", "workers", "sluice")
                     for path in (ROOT / package).rglob("*.py")
                     if re.search(r"\.ALERTS_CONFIG\b", path.read_text()))
    assert readers == ["core/cli/alerts.py"], "something else reads SLUICE_ALERTS_CONFIG now: update alerts.md"
    path = tmp_path / "alerts.json"
    path.write_text(json.dumps({"rules": [{"name": "orders deep", "kind": "queue_length", "threshold": 100}]}))
    settings.SLUICE_ALERTS_CONFIG = str(path)
    assert json.loads(sluice("alerts", "import"))["rules"] == 1
    assert AlertRule.objects.filter(name="orders deep").exists()
    assert "Nothing\nloads it at start" in page("operations/alerts.md")


# -- concepts.md, benchmarks.md: nothing readers do not have -------------------------------------

@no_database
def test_no_page_cites_the_internal_spec():
    found = [f"{p.relative_to(ROOT)}" for p in DOCS.rglob("*.md") if re.search(r"\bSPEC\b", p.read_text())]
    assert found == []


@no_database
def test_the_benchmarks_page_names_no_machine_path_and_says_where_the_peer_figures_come_from():
    text = page("benchmarks.md")
    assert not re.search(r"\.\./shared|/tmp/|/root/|/work/|/home/", text)
    harness = section(text, "## Comparisons with other queues: the peer harness")
    for peer in ("pgqueuer", "procrastinate", "Celery", "django-tasks-db"):
        assert peer in harness
    assert (ROOT / "benchmarks" / "tasks.py").is_file()  # the comparison the repository does ship
