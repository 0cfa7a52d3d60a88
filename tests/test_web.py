"""The web app's basics (Django's test client): the overview behind the login, and /healthz,
which stays open.  Every page: tests/test_dashboard_pages*.py; in a browser: test_browser_*.py."""
from __future__ import annotations

from django.db import connection

from core.transport import Transport
from tests.dashboard_pages_support import _fresh_dashboard_cache, operator, operator_client  # noqa: F401


def test_overview_lists_queues_with_counts(operator_client, make_queue):
    name = make_queue()
    transport = Transport()
    transport.send(name, "a")
    transport.send(name, "b", ttl=0)
    response = operator_client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-queue="{name}"' in html
    row = html.split(f'data-queue="{name}"')[1].split("</tr>")[0]
    assert '<td class="num pending ">1</td>' in row and '<td class="num expired ">1</td>' in row


def test_overview_needs_a_login(client, db):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/?next=/"


def test_partial_is_a_fragment(operator_client, queue):
    response = operator_client.get("/partials/overview/")
    assert response.status_code == 200
    assert b'<table id="queues">' in response.content and b"<html" not in response.content


def test_a_queue_whose_table_vanished_does_not_break_the_page(operator_client, make_queue):
    from core.queues import dialect

    name = make_queue()
    with connection.cursor() as cursor:
        for sql, params in dialect().drop_queue_table(name):
            cursor.execute(sql, params)
    response = operator_client.get("/")
    assert response.status_code == 200
    assert b"table unreadable" in response.content


def test_healthz_reports_database_redis_and_workers(operator_client, settings):
    """The details are for logged-in users (strangers get the status: test_dashboard_security.py)."""
    settings.REDIS_URL = "redis://127.0.0.1:6379/14"
    body = operator_client.get("/healthz").json()
    assert body["database"] == "up" and body["redis"] == "up"
    assert body["status"] in ("ok", "degraded") and isinstance(body["workers"], list)


def test_healthz_with_redis_down_is_degraded_not_down(operator_client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    response = operator_client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "degraded" and response.json()["redis"] == "down"
