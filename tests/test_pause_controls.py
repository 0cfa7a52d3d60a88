"""Pause and resume as operators use them: the queue page and the overview (button, badge),
the JSON API, `sluice queue pause|resume` (text and --json), every way audited with who did
it; viewers may not; the `stalled_queue` alert stays quiet for a paused queue and
`queue_paused` fires when a queue stays paused too long."""
from __future__ import annotations

import json
import time

import pytest

from core.runtime import pauses
from core.alerts.evaluator import evaluate
from core.models.alerts import AlertState, RuleKind
from core.transport import Transport
from dashboard.models import AuditEntry
from tests.alerts_support import own_alerts_queue, rule, states, target  # noqa: F401 (fixtures)
from tests.cli_support import sluice_here
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, operator, operator_client, viewer, viewer_client,
)

pytestmark = pytest.mark.django_db(transaction=True)


def last_audit(action: str) -> AuditEntry:
    entry = AuditEntry.objects.filter(action=action).order_by("-pk").first()
    assert entry is not None, f"no audit entry for {action}"
    return entry


# -- the pages ----------------------------------------------------------------------------------

def test_an_operator_pauses_and_resumes_from_the_queue_page(operator_client, operator, queue):
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert 'data-action="pause"' in page and "data-pause-banner" not in page
    response = operator_client.post(f"/queues/{queue}/pause/", {"next": f"/queues/{queue}/"})
    assert response.status_code == 303 and response["Location"] == f"/queues/{queue}/"
    assert pauses.pause_of(queue).paused_by == operator.username
    entry = last_audit("pause_queue")
    assert (entry.outcome, entry.via, entry.username, entry.target) == ("ok", "web", operator.username,
                                                                         f"queue {queue}")
    page = operator_client.get(f"/queues/{queue}/").content.decode()
    assert f'data-paused="{queue}"' in page and "data-pause-banner" in page and 'data-action="resume"' in page
    assert "Sends still land here" in page and "workers receive nothing" in page  # the flash message

    assert operator_client.post(f"/queues/{queue}/resume/").status_code == 303
    assert pauses.pause_of(queue) is None
    assert last_audit("resume_queue").detail == "resumed"


def test_the_overview_shows_a_badge_and_offers_resume(operator_client, queue):
    overview = operator_client.get("/").content.decode()
    assert f'aria-label="Pause {queue}"' in overview and f'data-paused="{queue}"' not in overview
    response = operator_client.post(f"/queues/{queue}/pause/", {"next": "/"})
    assert response["Location"] == "/"
    numbers = operator_client.get("/partials/overview/").content.decode()
    assert f'data-paused="{queue}"' in numbers and f'aria-label="Resume {queue}"' in numbers
    assert 'data-total="paused">1<' in numbers


def test_a_viewer_may_not_pause_and_the_denial_is_audited(viewer_client, viewer, queue):
    page = viewer_client.get(f"/queues/{queue}/").content.decode()
    assert 'data-action="pause"' in page and "disabled" in page
    assert viewer_client.post(f"/queues/{queue}/pause/").status_code == 403
    assert pauses.pause_of(queue) is None
    assert last_audit("pause_queue").outcome == "denied"


def test_pausing_an_unknown_queue_is_a_404_page(operator_client):
    response = operator_client.post("/queues/no_such_queue/pause/")
    assert response.status_code == 404 and b"unknown queue" in response.content


# -- the API ------------------------------------------------------------------------------------

def test_the_api_pauses_and_resumes(operator_client, viewer_client, operator, queue):
    status, body = api(viewer_client, "post", f"/api/queues/{queue}/pause/")
    assert status == 403 and body["error"]
    status, body = api(operator_client, "post", f"/api/queues/{queue}/pause/")
    assert status == 200 and body["queue"] == queue and body["paused"] and body["changed"]
    assert body["paused_by"] == operator.username and body["paused_at"]
    status, again = api(operator_client, "post", f"/api/queues/{queue}/pause/")
    assert status == 200 and again["paused"] and not again["changed"] and again["paused_at"] == body["paused_at"]
    status, listing = api(viewer_client, "get", "/api/queues/")
    assert next(q for q in listing["queues"] if q["name"] == queue)["paused"] is True
    assert last_audit("pause_queue").via == "api"

    status, body = api(operator_client, "post", f"/api/queues/{queue}/resume/")
    assert status == 200 and body == {"queue": queue, "paused": False, "changed": True, "paused_at": None,
                                      "paused_by": None}
    status, body = api(operator_client, "post", f"/api/queues/{queue}/resume/")
    assert status == 200 and not body["changed"]
    status, body = api(operator_client, "post", "/api/queues/no_such_queue/pause/")
    assert status == 404 and "unknown queue" in body["error"]


# -- the command line ---------------------------------------------------------------------------

def cli(*args: str) -> str:
    result = sluice_here(*args)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_the_command_line_pauses_and_resumes_in_text_and_json(queue):
    assert f"paused queue {queue}" in cli("queue", "pause", queue)
    assert f"queue {queue} was already paused" in cli("queue", "pause", queue)
    entry = last_audit("pause_queue")
    assert entry.via == "cli" and entry.username.endswith("(cli)") and entry.target == f"queue {queue}"
    listing = json.loads(cli("queue", "list", "--json"))
    assert next(r for r in listing if r["name"] == queue)["paused"] is True
    assert cli("queue", "resume", queue).strip() == f"resumed queue {queue}"
    assert last_audit("resume_queue").via == "cli"
    assert cli("queue", "resume", queue).strip() == f"queue {queue} was not paused"

    paused = json.loads(cli("queue", "pause", queue, "--json"))
    assert paused["queue"] == queue and paused["paused"] and paused["changed"] and paused["paused_by"].endswith("(cli)")
    assert json.loads(cli("queue", "pause", queue, "--json"))["changed"] is False
    assert json.loads(cli("queue", "resume", queue, "--json")) == {"queue": queue, "paused": False, "changed": True}
    assert json.loads(cli("queue", "resume", queue, "--json"))["changed"] is False


def test_the_command_line_names_an_unknown_queue():
    result = sluice_here("queue", "pause", "no_such_queue")
    assert result.returncode != 0 and b"does not exist" in result.stderr
    result = sluice_here("queue", "resume", "no_such_queue", "--json")
    assert result.returncode != 0 and b"does not exist" in result.stderr


# -- alerts -------------------------------------------------------------------------------------

@pytest.mark.usefixtures("own_alerts_queue")
def test_a_paused_queue_does_not_stall_and_a_long_pause_fires_queue_paused(queue, target):
    stalled = rule(RuleKind.STALLED_QUEUE, window_seconds=0.5, filters={"queue": queue})
    paused = rule(RuleKind.QUEUE_PAUSED, threshold=1.0, clear_after=1, filters={"queue": queue})
    Transport().send_many(queue, [{"n": i} for i in range(3)])
    pauses.pause(queue)
    time.sleep(0.6)
    evaluate()
    assert states(stalled) == [] and states(paused) == []  # waiting on purpose; not paused long yet
    time.sleep(0.6)
    evaluate()
    assert states(stalled) == [], "a paused queue waits on purpose: no stalled alert"
    assert states(paused) == [AlertState.FIRING]
    alert = paused.alerts.get()
    assert alert.labels["queue"] == queue and "paused for" in alert.summary
    pauses.resume(queue)
    evaluate()
    assert states(paused) == [AlertState.RESOLVED]
    assert states(stalled) == [AlertState.FIRING], "resumed with no worker: now it stalls"
