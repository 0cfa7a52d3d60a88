"""The dashboard's task result page (dashboard/views/tasks.py) with Django's test client, on
tasks run the real way (Sluice's backend, a pump, the error queue, ingestion): a successful
task's return value, a failed task's errors and tracebacks, the links between the result
and its message and failed-message pages, hostile values escaped, masking, 404 and roles."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from core.failures import ingest_errors
from core.models import FailedMessage
from core.transport import Transport
from tests.conftest import drain
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    XSS_SCRIPT, XSS_SCRIPT_ESCAPED, _fresh_dashboard_cache, make_user, viewer, viewer_client,
)
from tests.tasks_support import tasks_on_sluice  # noqa: F401

LINK = re.compile(r'<a href="(/tasks/[^"]+/)" data-task-result>Task result</a>')


def run_all(pump_for, setup, **options) -> None:
    drain(pump_for(setup.queue, concurrency=1, **options))


def result_url(result_id: str) -> str:
    return reverse("dashboard:task-result", args=[result_id])


def fail_a_task(pump_for, setup, key: str):
    """A task that fails every attempt: retried, then in the error queue and ingested."""
    from tests import task_funcs

    task_funcs.FAIL_NEXT[key] = 2
    result = task_funcs.flaky.enqueue(key)
    run_all(pump_for, setup, immediate_retries=1)
    ingest_errors()
    return result, FailedMessage.objects.get(message_id=result.id)


def test_a_successful_task_shows_its_status_times_and_return_value(tasks_on_sluice, pump_for,
                                                                     viewer_client):  # noqa: F811
    from tests.task_funcs import flaky

    result = flaky.enqueue("fine")
    run_all(pump_for, tasks_on_sluice)
    response = viewer_client.get(result_url(result.id))
    assert response.status_code == 200
    html = response.content.decode()
    assert '<span class="tag ok" data-task-status>SUCCESSFUL</span>' in html
    assert "tests.task_funcs.flaky" in html and tasks_on_sluice.queue in html
    # The return value, pretty JSON (escaped quotes), the arguments, one attempt and no error.
    assert "&quot;key&quot;: &quot;fine&quot;" in html and "&quot;attempt&quot;: 1" in html
    assert re.search(r"data-args>\[\s*&quot;fine&quot;\s*\]</pre>", html)
    assert re.search(r"data-task-attempts>1</td>", html)
    assert "No failed attempt." in html
    # Received: its message left the queue; it never failed.
    assert "received (no longer in the queue)" in html
    assert 'data-task-failed>—</td>' in html


def test_a_failed_task_shows_each_error_and_links_both_ways_with_its_failed_message(
        tasks_on_sluice, pump_for, viewer_client):  # noqa: F811
    result, record = fail_a_task(pump_for, tasks_on_sluice, "broken")
    # The failed-message page links to the result…
    detail = viewer_client.get(reverse("dashboard:failed-detail", args=[record.pk])).content.decode()
    assert LINK.search(detail).group(1) == result_url(result.id)
    # …which shows FAILED, both attempts' errors with their tracebacks, and links back.
    html = viewer_client.get(result_url(result.id)).content.decode()
    assert '<span class="tag bad" data-task-status>FAILED</span>' in html
    assert re.search(r"data-task-attempts>2 \(2 failed\)</td>", html)
    assert html.count("<details") == 2 and "Failed attempt 2: <strong" in html
    assert "builtins.ValueError" in html and "Traceback (most recent call last)" in html
    assert "broken fails on attempt 2" in html and "broken fails on attempt 1" in html
    assert f'href="{reverse("dashboard:failed-detail", args=[record.pk])}">failed message</a>' in html
    assert "moved to the error queue" in html
    assert "None yet: the task has not succeeded." in html


def test_a_waiting_tasks_message_page_links_to_its_result_and_back(tasks_on_sluice, viewer_client):  # noqa: F811
    from tests.task_funcs import add

    result = add.enqueue(2, 3)
    [message] = Transport().browse(tasks_on_sluice.queue)
    message_url = reverse("dashboard:message", args=[tasks_on_sluice.queue, message.row_version])
    html = viewer_client.get(message_url).content.decode()
    assert LINK.search(html).group(1) == result_url(result.id)
    page = viewer_client.get(result_url(result.id)).content.decode()
    assert '<span class="tag idle" data-task-status>READY</span>' in page
    assert f'<a href="{message_url}">the task\'s message</a>' in page
    assert "None yet" in page and re.search(r"data-task-attempts>0</td>", page)


def test_a_message_that_is_no_task_has_no_result_link(queue, viewer_client):  # noqa: F811
    Transport().send(queue, {"order": 1}, message_type="Shop.PlaceOrder")
    [message] = Transport().browse(queue)
    html = viewer_client.get(reverse("dashboard:message", args=[queue, message.row_version])).content.decode()
    assert html.count("<h2>Body</h2>") == 1  # the page itself rendered
    assert "Task result" not in html and "/tasks/" not in html


def test_a_task_whose_result_was_pruned_says_so(tasks_on_sluice, viewer_client):  # noqa: F811
    from core.models import TaskResultRecord
    from tests.task_funcs import add

    result = add.enqueue(1, 1)
    TaskResultRecord.objects.filter(pk=result.id).delete()
    [message] = Transport().browse(tasks_on_sluice.queue)
    html = viewer_client.get(reverse("dashboard:message", args=[tasks_on_sluice.queue, message.row_version])) \
        .content.decode()
    assert "gone (pruned after SLUICE_TASK_RESULTS_RETENTION)" in html and not LINK.search(html)


def test_task_values_are_escaped_and_masked(tasks_on_sluice, pump_for, viewer_client, settings):  # noqa: F811
    from tests.task_funcs import record_ping

    settings.SLUICE_MASK_BODY_FIELDS = ("key",)
    hostile = record_ping.enqueue(XSS_SCRIPT)
    secret = record_ping.enqueue(key="s3cret-value")
    run_all(pump_for, tasks_on_sluice)
    html = viewer_client.get(result_url(hostile.id)).content.decode()
    assert XSS_SCRIPT not in html and XSS_SCRIPT_ESCAPED in html  # as argument and as return value
    html = viewer_client.get(result_url(secret.id)).content.decode()
    assert "s3cret-value" not in re.search(r"data-kwargs>(.*?)</pre>", html, re.S).group(1)
    assert "&quot;key&quot;: &quot;***&quot;" in html


@pytest.mark.parametrize("result_id", ["0f0e0d0c-0000-4000-8000-000000000000", "x" * 65, "../..", "a/b", "a\x00b"])
def test_an_unknown_result_is_the_dashboards_404_page(transactional_db, viewer_client, result_id):  # noqa: F811
    response = viewer_client.get(result_url(result_id))
    assert response.status_code == 404
    html = response.content.decode()
    assert "There is no task result with this id" in html and "Traceback" not in html


def test_roles_anonymous_go_to_login_and_no_role_is_refused(tasks_on_sluice, viewer_client):  # noqa: F811
    from tests.task_funcs import add

    url = result_url(add.enqueue(1, 2).id)
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("dashboard:login"))
    nobody = Client()
    nobody.force_login(make_user(None))
    assert nobody.get(url).status_code == 403
    assert viewer_client.get(url).status_code == 200
    assert viewer_client.post(url).status_code == 405  # a page to read only


def test_the_docs_name_the_page_and_its_link_as_they_are():
    from tests.conftest import ROOT

    section = (ROOT / "docs" / "tasks.md").read_text().split("## Seeing a task in the dashboard")[1].split("\n## ")[0]
    assert "`/tasks/<result id>/`" in section and result_url("ID") == "/tasks/ID/"
    assert "**Task result**" in section and LINK.pattern.endswith(">Task result</a>")
    assert all(f"`{status}`" in section for status in ("READY", "RUNNING", "SUCCESSFUL", "FAILED"))


# -- the JSON API: GET /api/tasks/<result id>/ ----------------------------------------------------

def api_url(result_id: str) -> str:
    return reverse("dashboard:api-task-result", args=[result_id])


def test_the_api_answers_a_result_in_its_documented_shape(tasks_on_sluice, pump_for, viewer_client):  # noqa: F811
    from dashboard.api.tasks import TaskResultShape
    from tests.task_funcs import flaky

    fine = flaky.enqueue("api")
    broken, record = fail_a_task(pump_for, tasks_on_sluice, "api-broken")
    run_all(pump_for, tasks_on_sluice)
    answer = viewer_client.get(api_url(fine.id)).json()
    assert set(answer) == set(TaskResultShape().fields)
    assert answer["status"] == "SUCCESSFUL" and answer["return_value"] == {"key": "api", "attempt": 1}
    assert answer["args"] == ["api"] and answer["kwargs"] == {} and answer["attempts"] == 1
    assert answer["queue"] == tasks_on_sluice.queue and answer["errors"] == [] and answer["failed_id"] is None
    answer = viewer_client.get(api_url(broken.id)).json()
    assert answer["status"] == "FAILED" and answer["return_value"] is None and answer["failed_id"] == record.pk
    assert [e["exception_class_path"] for e in answer["errors"]] == ["builtins.ValueError"] * 2
    assert "api-broken fails on attempt 2" in answer["errors"][-1]["traceback"]


def test_the_api_masks_refuses_and_404s(tasks_on_sluice, viewer_client, settings):  # noqa: F811
    from tests.task_funcs import record_ping

    settings.SLUICE_MASK_BODY_FIELDS = ("key",)
    result = record_ping.enqueue(key="s3cret-value")
    assert viewer_client.get(api_url(result.id)).json()["kwargs"] == {"key": "***"}
    assert Client().get(api_url(result.id)).status_code == 401
    for unknown in ("0f0e0d0c-0000-4000-8000-000000000000", "x" * 65, "a\x00b"):
        missing = viewer_client.get(api_url(unknown))
        assert missing.status_code == 404 and "no task result has this id" in missing.json()["error"]
