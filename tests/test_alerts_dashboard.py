"""The Alerts page, the JSON API and /metrics: operators change rules, targets and silences
(audited), viewers read, secrets never leave the database; JSON import is all or nothing."""
from __future__ import annotations

import datetime as dt
import json

import pytest
from django.utils import timezone

from core.alerts.evaluator import evaluate
from core.models.alerts import AlertDelivery, AlertRule, AlertTarget, RuleKind, Silence
from core.transport import Transport
from dashboard.counting import stats
from dashboard.metrics import FIRING_KEY
from dashboard.models import AuditEntry
from tests.alerts_support import own_alerts_queue  # noqa: F401 (a fixture)
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import operator, operator_client, viewer, viewer_client  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("own_alerts_queue")]

SECRET_URL = "https://hooks.example.test/services/T000/B000/very-secret-token-42"
CONFIG = {
    "targets": [{"name": "slack", "format": "slack", "url": SECRET_URL},
                {"name": "pd", "format": "pagerduty", "url": "https://events.example.test/v2/enqueue",
                 "routing_key": "routing-key-secret-77"},
                {"name": "mail", "format": "email", "recipients": "ops@example.test"}],
    "rules": [{"name": "orders backlog", "kind": "queue_length", "threshold": 0, "clear_after": 1,
               "filters": {"queue": "q_*"}, "severity": "critical", "targets": ["slack", "pd"]}],
}


def test_operator_creates_a_rule_and_a_target_from_the_page_and_it_is_audited(operator_client):
    r = operator_client.post("/alerts/targets/", {"name": "am", "format": "alertmanager", "url": SECRET_URL,
                                                  "headers": "Authorization: Bearer hdr-secret-99", "max_per_hour": "5"})
    assert r.status_code == 303
    r = operator_client.post("/alerts/rules/", {"name": "stalled orders", "kind": "stalled_queue",
                                                "window_seconds": "120", "queue": "orders", "header": "tenant=acme",
                                                "targets": ["am"], "severity": "critical"})
    assert r.status_code == 303
    rule = AlertRule.objects.get()
    assert rule.filters == {"queue": "orders", "header": {"tenant": "acme"}} and rule.window_seconds == 120
    assert [t.name for t in rule.targets.all()] == ["am"]
    assert AlertTarget.objects.get().headers == {"Authorization": "Bearer hdr-secret-99"}
    page = operator_client.get("/alerts/").content.decode()
    assert "stalled orders" in page and "https://hooks.example.test/…" in page
    assert "very-secret-token-42" not in page and "hdr-secret-99" not in page
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "outcome"))
    assert actions == [("save_alert_target", "ok"), ("save_alert_rule", "ok")]
    assert not any("very-secret" in e.detail + e.target for e in AuditEntry.objects.all())
    # Saving again with an empty URL keeps the stored one (the form never shows it).
    operator_client.post("/alerts/targets/", {"name": "am", "format": "alertmanager", "url": "", "max_per_hour": "9"})
    target = AlertTarget.objects.get()
    assert target.url == SECRET_URL and target.max_per_hour == 9


def test_bad_input_is_refused_with_a_reason_and_changes_nothing(operator_client):
    r = operator_client.post("/alerts/rules/", {"name": "x", "kind": "no_such_kind"})
    assert r.status_code == 400 and "kind must be one of" in r.content.decode()
    r = operator_client.post("/alerts/targets/", {"name": "bad", "format": "slack", "url": "ftp://x"})
    assert r.status_code == 400 and "absolute http(s)" in r.content.decode()
    assert not AlertRule.objects.exists() and not AlertTarget.objects.exists()
    assert set(AuditEntry.objects.values_list("outcome", flat=True)) == {"rejected"}


def test_viewers_read_but_cannot_change(viewer_client):
    AlertRule.objects.create(name="r", kind=RuleKind.REDIS_DOWN)
    page = viewer_client.get("/alerts/")
    assert page.status_code == 200 and "Add or change a rule" not in page.content.decode()
    assert viewer_client.post("/alerts/rules/", {"name": "x", "kind": "redis_down"}).status_code == 403
    status, body = api(viewer_client, "post", "/api/alerts/rules/", {"name": "x", "kind": "redis_down"})
    assert status == 403
    status, body = api(viewer_client, "get", "/api/alerts/rules/")
    assert status == 200 and body["rules"][0]["name"] == "r"


def test_json_import_via_api_then_firing_alert_in_api_and_metrics(operator_client, make_queue):
    status, body = api(operator_client, "post", "/api/alerts/import/", CONFIG)
    assert status == 200 and body["imported"] == 4
    status, body = api(operator_client, "get", "/api/alerts/targets/")
    text = json.dumps(body)
    assert "very-secret-token-42" not in text and "routing-key-secret-77" not in text
    assert {t["name"]: t["has_routing_key"] for t in body["targets"]}["pd"] is True
    queue = make_queue()
    Transport().send(queue, {"n": 1})
    evaluate()
    status, body = api(operator_client, "get", "/api/alerts/")
    assert [a["labels"]["queue"] for a in body["active"]] == [queue]
    status, body = api(operator_client, "get", "/api/alerts/deliveries/")
    assert sorted(d["target"] for d in body["deliveries"]) == ["pd", "slack"]
    stats._cache().delete(FIRING_KEY)  # another test's scrape may have cached "none firing" (3 s)
    metrics = operator_client.get("/metrics").content.decode()
    line = next(x for x in metrics.splitlines() if x.startswith("sluice_alerts_firing{"))
    assert 'rule="orders backlog"' in line and f"queue={queue}" in line and line.endswith(" 1.0")
    status, body = api(operator_client, "get", "/api/alerts/export/")
    assert "very-secret-token-42" not in json.dumps(body) and sorted(body["rules"][0]["targets"]) == ["pd", "slack"]


def test_a_bad_import_changes_nothing(operator_client):
    bad = {**CONFIG, "rules": [*CONFIG["rules"], {"name": "oops", "kind": "queue_length", "threshold": "lots"}]}
    status, body = api(operator_client, "post", "/api/alerts/import/", bad)
    assert status == 400 and "threshold must be a number" in body["error"]
    assert not AlertTarget.objects.exists() and not AlertRule.objects.exists()


def test_silence_from_the_page_and_end_it(operator_client, make_queue):
    api(operator_client, "post", "/api/alerts/import/", CONFIG)
    rule = AlertRule.objects.get()
    r = operator_client.post("/alerts/silences/", {"rule": rule.pk, "minutes": "30", "comment": "deploy"})
    assert r.status_code == 303
    queue = make_queue()
    Transport().send(queue, {"n": 1})
    evaluate()
    assert not AlertDelivery.objects.exists()
    silence = Silence.objects.get()
    assert silence.created_by == "operator" or silence.created_by
    r = operator_client.post(f"/alerts/silences/{silence.pk}/end/")
    assert r.status_code == 303
    evaluate()
    assert AlertDelivery.objects.filter(event="firing").count() == 2
    status, body = api(operator_client, "get", "/api/alerts/silences/")
    assert body["silences"] == []


def test_maintenance_window_via_api_and_test_notification(operator_client):
    api(operator_client, "post", "/api/alerts/import/", CONFIG)
    start = timezone.now() + dt.timedelta(hours=1)
    status, body = api(operator_client, "post", "/api/alerts/silences/",
                       {"starts_at": start.isoformat(), "minutes": 120, "comment": "db upgrade"})
    assert status == 201
    s = Silence.objects.get()
    assert s.rule is None and s.starts_at == start
    target = AlertTarget.objects.get(name="slack")
    status, body = api(operator_client, "post", f"/api/alerts/targets/{target.pk}/test/")
    assert status == 202 and AlertDelivery.objects.get().event == "test"
