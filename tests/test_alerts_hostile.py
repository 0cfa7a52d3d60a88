"""A hostile operator and a hostile target against alerting (issue 35 items 4, 6, 8, 9): a
target moved to another server loses its stored secrets unless they are given again, a
target's answer never shows its URL's path or query, every part of a target URL is checked
on the way in (and a bad stored row still renders), and rules and silences refuse
non-finite and absurd numbers."""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from core.alerts.notify import test_notification as send_test_notification
from core.models.alerts import AlertRule, AlertTarget, DeliveryStatus, Silence, TargetFormat
from tests.alerts_support import own_alerts_queue, served_until  # noqa: F401 (a fixture)
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401
    _fresh_dashboard_cache, operator, operator_client, viewer, viewer_client,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _target(**fields) -> AlertTarget:
    return AlertTarget.objects.create(**{"name": "pd", "format": TargetFormat.PAGERDUTY,
                                         "url": "https://events.example.com/v2/enqueue",
                                         "routing_key": "ROUTINGSECRET42", "headers": {"Authorization": "Bearer HDRSECRET"},
                                         **fields})


# -- 4: a target moved to another server ----------------------------------------------------------

@pytest.mark.parametrize("url", ["http://attacker.example/", "https://events.example.com:8443/v2/enqueue",
                                 "http://events.example.com/v2/enqueue", "https://EVENTS.example.org/v2/enqueue"])
def test_a_target_moved_to_another_server_drops_its_stored_secrets(operator_client, url):
    target = _target(format=TargetFormat.ALERTMANAGER, routing_key="")
    status, body = api(operator_client, "put", f"/api/alerts/targets/{target.pk}/",
                       {"name": "pd", "format": "alertmanager", "url": url})
    assert status == 200, body
    target.refresh_from_db()
    assert target.url == url and target.headers == {} and target.routing_key == ""


def test_a_pagerduty_target_moved_elsewhere_needs_its_routing_key_again(operator_client):
    target = _target()
    moved = {"name": "pd", "format": "pagerduty", "url": "https://attacker.example/"}
    status, body = api(operator_client, "put", f"/api/alerts/targets/{target.pk}/", moved)
    assert status == 400 and "routing_key" in body["error"]
    target.refresh_from_db()
    assert target.routing_key == "ROUTINGSECRET42" and target.url == "https://events.example.com/v2/enqueue"
    # Given again with the new address, they are used.
    status, _ = api(operator_client, "put", f"/api/alerts/targets/{target.pk}/",
                    {**moved, "routing_key": "NEWKEY-1234", "headers": {"Authorization": "Bearer NEW"}})
    target.refresh_from_db()
    assert status == 200 and target.routing_key == "NEWKEY-1234" and target.headers == {"Authorization": "Bearer NEW"}


def test_the_same_server_keeps_the_stored_secrets(operator_client):
    target = _target()
    for url in ("", "https://events.example.com/v2/other", "https://events.example.com:443/v2/enqueue"):
        status, body = api(operator_client, "put", f"/api/alerts/targets/{target.pk}/",
                           {"name": "pd", "format": "pagerduty", "url": url})
        assert status == 200, body
        target.refresh_from_db()
        assert target.routing_key == "ROUTINGSECRET42" and target.headers == {"Authorization": "Bearer HDRSECRET"}


def test_an_import_that_moves_a_target_drops_its_secrets(operator_client):
    target = _target(format=TargetFormat.ALERTMANAGER, routing_key="")
    status, _ = api(operator_client, "post", "/api/alerts/import/",
                    {"targets": [{"name": "pd", "format": "alertmanager", "url": "http://attacker.example/x"}]})
    target.refresh_from_db()
    assert status == 200 and target.headers == {}


# -- 6: a target's answer echoes its URL ----------------------------------------------------------

class EchoServer:
    """Answers every POST with a 500 whose body echoes the request's path and query, padded
    so that a cut at a fixed length would fall inside the secret."""

    def __init__(self, pad: int = 0) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = ("x" * pad + f"no route for POST {self.path} (host {self.headers.get('Host')})").encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/PATHSECRET9?token=QSECRET"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("pad", [0, 264])
def test_delivery_errors_never_show_the_target_urls_path_or_query(viewer_client, own_alerts_queue, settings, caplog,
                                                                   pad):
    settings.SLUICE_ALERTS_DELIVERY_ATTEMPTS = 1
    settings.SLUICE_PEEK_DELAY = 0.05
    echo = EchoServer(pad)
    caplog.set_level(logging.INFO, logger="sluice")
    try:
        target = AlertTarget.objects.create(name="echo", format=TargetFormat.SLACK, url=echo.url)
        send_test_notification(target, timezone.now())
        delivery = served_until(DeliveryStatus.FAILED)
    finally:
        echo.close()
    assert delivery.last_error.startswith("HTTP 500") and len(delivery.last_error) <= 400
    status, body = api(viewer_client, "get", "/api/alerts/deliveries/")
    page = viewer_client.get("/alerts/").content.decode()
    for shown in (delivery.last_error, str(body), page, caplog.text):
        for secret in ("PATHSECRET", "QSECRET", "hooks/T0/B0", "SECRET9"):
            assert secret not in shown


# -- 8: every part of a target URL ----------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://hooks.example:99999/x", "http://hooks.example:0/x", "http://hooks.example:-1/",
                                 "http://hooks.example:8o/x", "http://[::1/x", "http://hooks example/x",
                                 "http://hooks.example/a b", "http://hooks.example/\tx", "ftp://hooks.example/",
                                 "http://hooks.example/x\x7f", "http://hooks$.example/x", "http:///x"])
def test_a_bad_target_url_is_refused_with_a_reason(operator_client, url):
    status, body = api(operator_client, "post", "/api/alerts/targets/",
                       {"name": "bad", "format": "alertmanager", "url": url})
    assert status == 400 and "url" in body["error"], body
    assert not AlertTarget.objects.filter(name="bad").exists()
    response = operator_client.post("/alerts/targets/", {"name": "bad", "format": "alertmanager", "url": url})
    assert response.status_code in (302, 303, 400) and not AlertTarget.objects.filter(name="bad").exists()


def test_a_bad_stored_target_url_still_renders(viewer_client):
    AlertTarget.objects.create(name="stored", format=TargetFormat.ALERTMANAGER, url="http://hooks.example:99999/x")
    assert viewer_client.get("/alerts/").status_code == 200
    status, body = api(viewer_client, "get", "/api/alerts/targets/")
    assert status == 200 and body["targets"][0]["name"] == "stored"


# -- 9: numbers in rules and silences -------------------------------------------------------------

RULE = {"name": "r", "kind": "queue_length", "threshold": 5}


@pytest.mark.parametrize("field, value", [
    ("threshold", "inf"), ("threshold", "-inf"), ("threshold", "nan"), ("threshold", 1e300), ("threshold", "1e309"),
    ("window_seconds", "inf"), ("window_seconds", 1e300), ("for_seconds", "nan"), ("for_seconds", 1e300),
    ("clear_after", 1e300), ("clear_after", "inf"), ("clear_after", 10 ** 30)])
def test_rules_refuse_non_finite_and_absurd_numbers(operator_client, field, value):
    status, body = api(operator_client, "post", "/api/alerts/rules/", {**RULE, field: value})
    assert status == 400 and field in body["error"], body
    response = operator_client.post("/alerts/rules/", {**RULE, field: str(value)})
    assert response.status_code in (302, 303, 400)
    assert not AlertRule.objects.exists()
    assert api(operator_client, "get", "/api/alerts/rules/")[0] == 200


def test_a_stored_infinite_threshold_still_renders(viewer_client):
    AlertRule.objects.create(name="old", kind="queue_length", threshold=float("inf"))
    for path in ("/api/alerts/rules/", "/api/alerts/export/"):
        status, _ = api(viewer_client, "get", path)
        assert status == 200, path
    assert viewer_client.get("/alerts/").status_code == 200


@pytest.mark.parametrize("data", [{"minutes": "nan"}, {"minutes": "inf"}, {"minutes": 1e309}, {"minutes": 1e300},
                                  {"minutes": "-5"}, {"starts_at": "9999-12-31T23:00:00", "minutes": 60},
                                  {"starts_at": "9999-12-31T23:59:59-14:00", "minutes": 60},
                                  {"starts_at": "0001-01-01T00:00:00+14:00", "minutes": 60},
                                  {"ends_at": "9999-12-31T23:59:59"}, {"minutes": [1]}])
def test_silences_refuse_non_finite_and_absurd_times(operator_client, data):
    status, body = api(operator_client, "post", "/api/alerts/silences/", {"comment": "x", **data})
    assert status == 400, body
    response = operator_client.post("/alerts/silences/", {k: str(v) for k, v in data.items()})
    assert response.status_code in (302, 303, 400)
    assert not Silence.objects.exists()


@pytest.mark.parametrize("filters", [{"queue": {"x": {"x": "orders"}}}, {"queue": ["orders"]}, {"worker": 7},
                                     {"header": {"Tenant": {"x": "y"}}}])
def test_rule_filters_are_text(operator_client, filters):
    status, body = api(operator_client, "post", "/api/alerts/rules/", {**RULE, "filters": filters})
    assert status == 400 and "filters" in body["error"], body
    assert not AlertRule.objects.exists()
