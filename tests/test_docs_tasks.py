"""docs/tasks.md runs as written: its Python blocks (each opens with ``# <path>.py``) become a
settings dict and a package ``shop`` in a temporary directory, and the page's story is
played on the test database — sign-up view, worker, results, a rolled-back sign-up."""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
from django.core import mail
from django.test import RequestFactory, override_settings

from core.handlers import handlers
from core.queues import create_queue, delete_queue
from tests.conftest import drain

PAGE = Path(__file__).resolve().parent.parent / "docs" / "tasks.md"
BLOCK = re.compile(r"```python\n# (?P<path>[\w/]+\.py)\n(?P<code>.*?)```", re.S)


def blocks() -> dict[str, str]:
    return {m.group("path"): m.group("code") for m in BLOCK.finditer(PAGE.read_text())}


def test_the_page_has_its_blocks():
    assert {"settings.py", "shop/tasks.py", "shop/views.py", "shop/status.py", "shop/reports.py"} <= set(blocks())


@pytest.fixture
def shop(tmp_path, transactional_db, error_queue):
    from core.tasks.backend import TASK_MESSAGE_TYPE
    from core.tasks.worker import register

    code = blocks()
    namespace: dict = {}
    exec(code["settings.py"], namespace)
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for path, text in code.items():
        if path.startswith("shop/"):
            (tmp_path / path).write_text(text)
    sys.path.insert(0, str(tmp_path))
    with override_settings(TASKS=namespace["TASKS"], EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend"):
        queues = register()
        for queue in queues:
            create_queue(queue)
        try:
            yield importlib.import_module("shop.views"), importlib.import_module("shop.status")
        finally:
            for queue in queues:
                handlers.unregister(queue, TASK_MESSAGE_TYPE)
                delete_queue(queue)
            sys.path.remove(str(tmp_path))
            for name in [n for n in sys.modules if n == "shop" or n.startswith("shop.")]:
                del sys.modules[name]


def test_the_page_runs_as_written(shop, pump_for):
    views, status = shop
    post = RequestFactory().post("/sign-up", {"username": "ada", "email": "ada@example.com"})
    created = views.sign_up(post)
    assert created.status_code == 201
    result_id = created.content.decode()
    assert status.welcome_status(result_id) == "READY"
    # The same name again: the user's INSERT fails, and the task goes with it.
    again = views.sign_up(RequestFactory().post("/sign-up", {"username": "ada", "email": "other@example.com"}))
    assert again.status_code == 409
    drain(pump_for("emails", concurrency=1))
    assert [m.to for m in mail.outbox] == [["ada@example.com"]]
    from django.contrib.auth.models import User

    assert status.welcome_status(result_id) == {"user_id": User.objects.get(username="ada").pk, "attempt": 1}


def test_the_page_s_per_task_options_reach_the_message(shop):
    """The page's task with Sluice's options: its message has the TTL and the retry counts."""
    from core.tasks.backend import DELAYED_RETRIES_HEADER, IMMEDIATE_RETRIES_HEADER
    from core.transport import Transport

    reports = importlib.import_module("shop.reports")
    result = reports.nightly_report.enqueue("2026-01-01")
    [message] = [m for m in Transport().browse("default") if m.id == result.id]
    assert message.expires is not None
    assert (message.headers[IMMEDIATE_RETRIES_HEADER], message.headers[DELAYED_RETRIES_HEADER]) == ("1", "0")
