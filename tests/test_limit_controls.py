"""A queue's limits as operators set them: the queue page's form, the JSON API and
`sluice queue limit` (text and --json), every way audited with who did it; viewers may not;
bad input is a clear error on each way in, and changes nothing."""
from __future__ import annotations

import json

import pytest

from core.runtime import limits
from dashboard.models import AuditEntry
from tests.cli_support import sluice_here
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, operator, operator_client, viewer, viewer_client,
)

pytestmark = pytest.mark.django_db(transaction=True)


def last_audit(action: str = "limit_queue") -> AuditEntry:
    entry = AuditEntry.objects.filter(action=action).order_by("-pk").first()
    assert entry is not None, f"no audit entry for {action}"
    return entry


def in_force(queue: str) -> tuple:
    found = limits.limits_of(queue)
    return found.concurrency, found.rate, found.source


# -- the page -----------------------------------------------------------------------------------

def test_an_operator_sets_and_clears_limits_from_the_queue_page(operator_client, operator, queue, settings):
    settings.SLUICE_QUEUE_LIMITS = {queue: {"rate": 50}}
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert f'data-limits="{queue}"' in page and 'data-limit-source="settings"' in page and 'value="50"' in page
    response = operator_client.post(f"/queues/{queue}/limit/", {"concurrency": "3", "rate": "",
                                                                 "next": f"/queues/{queue}/"})
    assert response.status_code == 303 and response["Location"] == f"/queues/{queue}/"
    assert in_force(queue) == (3, None, "database")
    entry = last_audit()
    assert (entry.outcome, entry.via, entry.username, entry.target) == ("ok", "web", operator.username,
                                                                         f"queue {queue}")
    assert entry.detail == "at most 3 at once (set by an operator)"
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert 'data-limit-source="database"' in page and 'data-action="clear-limits"' in page
    assert "at most 3 at once" in page  # the flash message

    assert operator_client.post(f"/queues/{queue}/limit/", {"do": "clear"}).status_code == 303
    assert in_force(queue) == (None, 50, "settings")
    assert last_audit().detail.startswith("cleared")


@pytest.mark.parametrize("concurrency, rate", [("0", ""), ("", "10001"), ("two", ""), ("1.5", "")])
def test_a_bad_limit_on_the_page_is_a_message_and_changes_nothing(operator_client, queue, concurrency, rate):
    response = operator_client.post(f"/queues/{queue}/limit/", {"concurrency": concurrency, "rate": rate},
                                    follow=True)
    assert response.status_code in (200, 400)
    assert "whole number 1–10000" in response.content.decode()
    assert in_force(queue) == (None, None, "")
    assert last_audit().outcome == "rejected"


def test_a_viewer_may_not_limit_and_the_denial_is_audited(viewer_client, queue):
    page = viewer_client.get(f"/queues/{queue}/").content.decode()
    assert 'data-action="limit"' in page and "disabled" in page
    assert viewer_client.post(f"/queues/{queue}/limit/", {"concurrency": "1"}).status_code == 403
    assert in_force(queue) == (None, None, "")
    assert last_audit().outcome == "denied"


def test_limiting_an_unknown_queue_is_a_404_page(operator_client):
    response = operator_client.post("/queues/no_such_queue/limit/", {"concurrency": "1"})
    assert response.status_code == 404 and b"unknown queue" in response.content


# -- the API ------------------------------------------------------------------------------------

def test_the_api_reads_sets_and_clears_limits(operator_client, viewer_client, operator, queue):
    status, body = api(viewer_client, "get", f"/api/queues/{queue}/limits/")
    assert status == 200 and body == {"queue": queue, "concurrency": None, "rate": None, "source": "",
                                      "set_at": None, "set_by": None, "changed": False}
    status, body = api(viewer_client, "post", f"/api/queues/{queue}/limits/", {"concurrency": 2})
    assert status == 403 and body["error"] and last_audit().outcome == "denied"
    status, body = api(operator_client, "post", f"/api/queues/{queue}/limits/", {"concurrency": 2, "rate": 20})
    assert status == 200 and (body["concurrency"], body["rate"], body["source"], body["changed"]) == \
        (2, 20, "database", True)
    assert body["set_by"] == operator.username and body["set_at"]
    status, body = api(operator_client, "post", f"/api/queues/{queue}/limits/", {"rate": None})  # concurrency kept
    assert status == 200 and (body["concurrency"], body["rate"], body["changed"]) == (2, None, True)
    status, body = api(operator_client, "post", f"/api/queues/{queue}/limits/", {})
    assert status == 200 and body["changed"] is False
    status, listing = api(viewer_client, "get", "/api/queues/")
    row = next(q for q in listing["queues"] if q["name"] == queue)
    assert (row["concurrency_limit"], row["rate_limit"]) == (2, None)
    assert last_audit().via == "api"
    status, body = api(operator_client, "delete", f"/api/queues/{queue}/limits/")
    assert status == 200 and body["changed"] and body["source"] == "" and body["concurrency"] is None
    status, body = api(operator_client, "delete", f"/api/queues/{queue}/limits/")
    assert status == 200 and body["changed"] is False


@pytest.mark.parametrize("data, message", [
    ({"concurrency": 0}, "whole number 1–10000"),
    ({"rate": 10_001}, "whole number 1–10000"),
    ({"rate": "5"}, "rate must be a whole number 1–10000 or null"),
    ({"concurrency": 1.5}, "concurrency must be a whole number"),
    ({"concurrency": True}, "concurrency must be a whole number"),
    ({"burst": 3}, "unknown field(s) burst"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_limits_through_the_api_are_a_400_and_change_nothing(operator_client, queue, data, message):
    status, body = api(operator_client, "post", f"/api/queues/{queue}/limits/", data)
    assert status == 400 and message in body["error"]
    assert in_force(queue) == (None, None, "")


def test_the_api_names_an_unknown_queue(operator_client):
    for method in ("get", "delete"):
        status, body = api(operator_client, method, "/api/queues/no_such_queue/limits/")
        assert status == 404 and "unknown queue" in body["error"]
    status, body = api(operator_client, "post", "/api/queues/no_such_queue/limits/", {"rate": 1})
    assert status == 404 and "unknown queue" in body["error"]


# -- the command line ---------------------------------------------------------------------------

def cli(*args: str) -> str:
    result = sluice_here(*args)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_the_command_line_shows_sets_and_clears_limits_in_text_and_json(queue):
    assert cli("queue", "limit", queue).strip() == f"queue {queue}: no limits"
    out = cli("queue", "limit", queue, "--concurrency", "2")
    assert out.startswith(f"queue {queue}: at most 2 at once (set by ") and "(cli)" in out
    entry = last_audit()
    assert entry.via == "cli" and entry.username.endswith("(cli)") and entry.detail == "at most 2 at once"
    body = json.loads(cli("queue", "limit", queue, "--rate", "7", "--json"))
    assert (body["queue"], body["concurrency"], body["rate"], body["source"], body["changed"]) == \
        (queue, 2, 7, "database", True)
    assert body["set_by"].endswith("(cli)") and body["set_at"]
    assert json.loads(cli("queue", "limit", queue, "--rate", "7", "--json"))["changed"] is False
    listing = json.loads(cli("queue", "list", "--json"))
    row = next(r for r in listing if r["name"] == queue)
    assert (row["concurrency_limit"], row["rate_limit"]) == (2, 7)
    assert json.loads(cli("queue", "limit", queue, "--concurrency", "none", "--json"))["concurrency"] is None
    body = json.loads(cli("queue", "limit", queue, "--clear", "--json"))
    assert body["changed"] is True and body["source"] == "" and last_audit().detail == "cleared"
    assert json.loads(cli("queue", "limit", queue, "--clear", "--json"))["changed"] is False


@pytest.mark.parametrize("args, message", [
    (("--concurrency", "0"), b"concurrency must be a whole number 1\xe2\x80\x9310000"),
    (("--rate", "lots"), b"wants a whole number or none"),
    (("--clear", "--rate", "3"), b"--clear drops the queue's limits"),
])
def test_the_command_line_refuses_bad_limits(queue, args, message):
    result = sluice_here("queue", "limit", queue, *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert in_force(queue) == (None, None, "")


def test_the_command_line_names_an_unknown_queue():
    result = sluice_here("queue", "limit", "no_such_queue", "--rate", "3")
    assert result.returncode != 0 and b"does not exist" in result.stderr
