"""GET /api/metrics/ and POST /api/metrics/run/ (shape, filters, bad input, the shared roles,
token auth) and the /metrics/charts/ page in the dashboard's layout (SVG charts, last run,
the run-now action queuing a real Celery task, audited; htmx polling while it runs)."""
from __future__ import annotations

import base64
import datetime as dt
import json
import sys
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from dashboard.security import tokens

from core.models.records import MetricWindow, PipelineRun
from dashboard.models import AuditEntry
from tests.dashboard_api_support import broker, clean_broker  # noqa: F401 — fixture

T0 = dt.datetime(2026, 11, 23, 10, 0, tzinfo=dt.timezone.utc)
FIELDS = ["queue", "message_type", "window_start", "window_seconds", "messages", "throughput_per_s",
          "processing_ms_p50", "processing_ms_p95", "processing_ms_p99", "critical_ms_p99", "failure_rate",
          "retries", "expired", "dead_lettered"]


def user(name: str, *groups: str, superuser: bool = False) -> User:
    u = User.objects.create_user(name, password="pw", is_superuser=superuser)
    for g in groups:
        u.groups.add(Group.objects.get_or_create(name=g)[0])
    return u


def client_for(u: User) -> Client:
    c = Client()
    c.force_login(u)
    return c


@pytest.fixture
def windows(db):
    rows = []
    for i in range(5):
        for queue, mtype in (("orders", "Order"), ("billing", "Invoice")):
            rows.append(MetricWindow(queue=queue, message_type=mtype, window_start=T0 + dt.timedelta(minutes=i),
                                     window_seconds=60, messages=60 + i, throughput_per_s=(60 + i) / 60,
                                     processing_ms_p50=2.0 + i, processing_ms_p95=8.0, processing_ms_p99=12.5,
                                     critical_ms_p50=20.0, critical_ms_p95=80.0, critical_ms_p99=120.0,
                                     failure_rate=0.1 * (queue == "billing"), failures=6 * (queue == "billing"),
                                     retries=1, expired=2, dead_lettered=0))
    rows.append(MetricWindow(queue="orders", message_type="Order", window_start=T0, window_seconds=3600,
                             messages=310, throughput_per_s=310 / 3600, failure_rate=0.0))
    MetricWindow.objects.bulk_create(rows)
    PipelineRun.objects.create(status="succeeded", stage="done", progress=100, exported=620, windows=11,
                               seconds=12.5, spark_master="local[*]", started_at=T0, finished_at=T0)


def test_shape_and_filters(windows):
    c = client_for(user("v", "sluice-viewer"))
    body = c.get("/api/metrics/").json()
    assert set(body) == {"windows", "last_run", "next_before"} and body["next_before"] is None
    assert len(body["windows"]) == 10 and list(body["windows"][0]) == FIELDS
    first = body["windows"][0]
    assert first["window_start"] == "2026-11-23T10:00:00+00:00" and first["window_seconds"] == 60
    assert body["last_run"]["status"] == "succeeded" and body["last_run"]["windows"] == 11
    orders = c.get("/api/metrics/?queue=orders&message_type=Order&since=2026-11-23T10:03:00Z").json()["windows"]
    assert [w["messages"] for w in orders] == [63, 64]
    hourly = c.get("/api/metrics/?window=3600").json()["windows"]
    assert [(w["queue"], w["messages"], w["processing_ms_p99"]) for w in hourly] == [("orders", 310, None)]
    assert c.get("/api/metrics/?queue=nothing").json()["windows"] == []


def test_bad_input_is_a_400_with_a_message(windows):
    c = client_for(user("v", "sluice-viewer"))
    r = c.get("/api/metrics/?window=5")
    assert r.status_code == 400 and "window must be 60 or 3600" in r.json()["error"]
    r = c.get("/api/metrics/?since=yesterday")
    assert r.status_code == 400 and "ISO 8601" in r.json()["error"]


def test_roles_and_token_auth(windows):
    anonymous = Client().get("/api/metrics/")
    assert anonymous.status_code in (401, 403) and anonymous.json()["error"]  # as every API endpoint
    assert client_for(user("nobody")).get("/api/metrics/").status_code == 403
    for u in (user("op", "sluice-operator"), user("root", superuser=True), user("v", "sluice-viewer")):
        assert client_for(u).get("/api/metrics/").status_code == 200
    token = tokens.issue(User.objects.get(username="v"))[1]
    r = Client().get("/api/metrics/", HTTP_AUTHORIZATION=f"Token {token}")
    assert r.status_code == 200 and len(r.json()["windows"]) == 10
    wrong = Client().get("/api/metrics/", HTTP_AUTHORIZATION="Token wrong")
    assert wrong.status_code in (401, 403) and "token" in wrong.json()["error"].lower()
    nobody_token = tokens.issue(User.objects.get(username="nobody"))[1]
    assert Client().get("/api/metrics/", HTTP_AUTHORIZATION=f"Token {nobody_token}").status_code == 403


def test_charts_page(windows):
    assert Client().get("/metrics/charts/").status_code == 302  # to the login page
    assert client_for(user("nobody")).get("/metrics/charts/").status_code == 403
    page = client_for(user("v", "sluice-viewer")).get("/metrics/charts/").content.decode()
    assert page.count("<svg") == 6  # two queues × throughput, processing time, failure rate
    assert "orders" in page and "billing" in page and "polyline" in page
    assert "Last pipeline run" in page and "local[*]" in page
    assert 'href="/static/dashboard/sluice.css"' in page and "<style" not in page  # the dashboard's layout
    assert 'href="/metrics/charts/" aria-current="page">Metrics</a>' in page
    # Viewers see the button disabled, with the reason, as on the other pages.
    assert 'disabled title="Your role is sluice-viewer' in page and "Run the pipeline now" in page
    op_page = client_for(user("op", "sluice-operator")).get("/metrics/charts/").content.decode()
    assert op_page.count("Run the pipeline now") == 1 and 'hx-post="/metrics/charts/run/"' in op_page
    assert "disabled" not in op_page.split('id="last-run"')[1].split("</section>")[0]
    bad = client_for(User.objects.get(username="v")).get("/metrics/charts/?window=7")
    assert bad.status_code == 400 and "window must be 60 or 3600" in bad.content.decode()
    overview = client_for(User.objects.get(username="v")).get("/").content.decode()
    assert 'href="/metrics/charts/"' in overview


def test_many_windows_show_the_newest_and_the_api_pages_back(windows, monkeypatch):
    """More windows than a page holds: the page shows the newest (it once cut the newest
    off), listed oldest first, and ``next_before`` pages back without a gap or a repeat."""
    c = client_for(user("v", "sluice-viewer"))
    newest = "2026-11-23T10:04:00+00:00"
    body = c.get("/api/metrics/?limit=3").json()
    # 2 windows per minute: a page of 3 would split minute 10:03, so it holds minute 10:04 only.
    assert [w["window_start"] for w in body["windows"]] == [newest, newest]
    seen, before = [], None
    for _ in range(10):
        page = c.get("/api/metrics/?limit=3" + (f"&before={quote(before)}" if before else "")).json()
        seen = page["windows"] + seen
        before = page["next_before"]
        if before is None:
            break
    assert [(w["window_start"], w["queue"]) for w in seen] == [
        (f"2026-11-23T10:0{i}:00+00:00", q) for i in range(5) for q in ("billing", "orders")]
    assert c.get("/api/metrics/?before=yesterday").status_code == 400
    # Valid ISO 8601, but an offset out of PostgreSQL's range (found by schemathesis): read in UTC.
    odd = c.get("/api/metrics/?before=" + quote("3644-11-11T05:59:58+19:25") + "&since=" + quote("2026-11-23T10:02:00-23:59"))
    assert odd.status_code == 200, odd.content
    assert c.get("/api/metrics/?before=" + quote("0001-01-01T00:00:00+05:00")).status_code == 400
    monkeypatch.setattr("dashboard.views.charts.MAX_POINTS", 4)
    response = c.get("/metrics/charts/")
    assert response.context["last"].isoformat() == newest
    assert response.context["first"].isoformat() == "2026-11-23T10:03:00+00:00"


def test_the_charts_page_says_when_the_pipeline_extra_is_missing(windows, monkeypatch):
    viewer = client_for(user("v", "sluice-viewer"))
    assert "cannot run on this installation" not in viewer.get("/metrics/charts/").content.decode()
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    page = viewer.get("/metrics/charts/").content.decode()
    assert 'pyspark not installed: pip install &quot;django-sluice[pipeline]&quot;' in page
    assert page.count("<svg") == 6  # the windows already loaded still show


def test_empty_charts_page(db):
    page = client_for(user("v", "sluice-viewer")).get("/metrics/charts/").content.decode()
    assert "No metric windows yet" in page and "has not run yet" in page


def queued_tasks() -> list[dict]:
    return [json.loads(m) for m in broker().lrange("sluice", 0, -1)]


def test_a_viewer_sees_the_page_but_may_not_run(windows):
    viewer = client_for(user("v", "sluice-viewer"))
    assert viewer.get("/metrics/charts/").status_code == 200
    runs = PipelineRun.objects.count()
    r = viewer.post("/metrics/charts/run/")
    assert r.status_code == 403 and "sluice-operator" in r.content.decode()
    api = viewer.post("/api/metrics/run/", {}, content_type="application/json")
    assert api.status_code == 403 and "operator" in api.json()["error"]
    assert PipelineRun.objects.count() == runs  # nothing queued
    denied = list(AuditEntry.objects.filter(action="run_pipeline").order_by("id").values_list("username", "outcome", "via"))
    assert denied == [("v", "denied", "web"), ("v", "denied", "api")]


def test_run_now_queues_a_celery_task_and_shows_progress(windows, clean_broker):
    op = client_for(user("op", "sluice-operator"))
    r = op.post("/metrics/charts/run/")
    assert r.status_code == 303 and r["Location"] == "/metrics/charts/"
    run = PipelineRun.objects.order_by("-id").first()
    assert (run.status, run.trigger) == ("queued", "dashboard:op")
    queued = queued_tasks()
    assert [m["headers"]["task"] for m in queued] == ["sluice.run_pipeline"]
    assert f'"run_id": {run.pk}' in base64.b64decode(queued[0]["body"]).decode()
    entry = AuditEntry.objects.get(action="run_pipeline")
    assert (entry.username, entry.outcome, entry.via, entry.target_ids) == ("op", "ok", "web", [str(run.pk)])
    page = op.get("/metrics/charts/").content.decode()
    assert 'http-equiv="refresh"' not in page
    panel = page.split('id="last-run"')[1].split("</section>")[0]
    assert 'hx-get="/metrics/charts/run-status/" hx-trigger="every 2s"' in panel and "disabled" in panel
    run.status, run.stage, run.progress = "running", "job", 30
    run.save()
    fragment = op.get("/metrics/charts/run-status/", HTTP_HX_REQUEST="true")
    assert 'aria-valuenow="30"' in fragment.content.decode() and "HX-Refresh" not in fragment
    run.status, run.progress = "succeeded", 100
    run.save()
    done = op.get("/metrics/charts/run-status/", HTTP_HX_REQUEST="true")
    assert done["HX-Refresh"] == "true" and "hx-trigger" not in done.content.decode()  # polling stops


def test_run_through_the_api(windows, clean_broker):
    token = tokens.issue(user("op", "sluice-operator"))[1]
    r = Client().post("/api/metrics/run/", {"since": "2026-11-23T10:00:00Z"}, content_type="application/json",
                      HTTP_AUTHORIZATION=f"Token {token}")
    assert r.status_code == 202
    run = PipelineRun.objects.get(pk=r.json()["run"])
    assert (run.status, run.trigger) == ("queued", "api:op")
    body = base64.b64decode(queued_tasks()[0]["body"]).decode()
    assert '"since": "2026-11-23T10:00:00+00:00"' in body
    assert AuditEntry.objects.get(action="run_pipeline").via == "api"
    assert Client().get("/api/metrics/", HTTP_AUTHORIZATION=f"Token {token}").json()["last_run"]["id"] == run.pk
    bad = Client().post("/api/metrics/run/", {"since": "soon"}, content_type="application/json",
                        HTTP_AUTHORIZATION=f"Token {token}")
    assert bad.status_code == 400 and "ISO 8601" in bad.json()["error"]
    assert len(queued_tasks()) == 1


def test_run_now_with_the_broker_down(windows, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/6"  # nothing listens there
    r = client_for(user("op", "sluice-operator")).post("/metrics/charts/run/")
    run = PipelineRun.objects.order_by("-id").first()
    assert run.status == "failed" and "could not queue" in run.error
    assert r.status_code == 503 and "could not be started" in r.content.decode()
    assert AuditEntry.objects.get(action="run_pipeline").outcome == "error"
