"""The dashboard's security (issue 20 items 8-11, 13, 14): login throttling and password
rules, hashed expiring tokens with an audited CLI, /healthz and /api/schema/ for logged-in
users only, the CSP and other headers, authorization before validation, and an API whose
every error is JSON.  Browser checks (no CSP violation on any page): test_browser_csp.py."""
from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.utils import timezone

from core.models import BulkOperation
from core.transport import Transport
from dashboard.security import tokens
from dashboard.models import ApiToken, AuditEntry
from tests.dashboard_api_support import api
from tests.dashboard_pages_support import (  # noqa: F401
    PASSWORD, _fresh_dashboard_cache, fail_message, make_user, operator, operator_client, viewer, viewer_client,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD_PASSWORD = "tidal-basin-7304"


def sluice(*args: str, stdin: str | None = None) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    if stdin is None:
        call_command("sluice", *args, stdout=out, stderr=err)
    else:
        saved, sys.stdin = sys.stdin, io.StringIO(stdin)
        try:
            call_command("sluice", *args, stdout=out, stderr=err)
        finally:
            sys.stdin = saved
    return out.getvalue(), err.getvalue()


# -- 8: logins and passwords ----------------------------------------------------------------------

def test_weak_passwords_are_refused_by_the_cli(transactional_db):
    with pytest.raises(CommandError, match="password refused"):
        sluice("user", "add", "weak", "--role", "viewer", "--password", "a")
    with pytest.raises(CommandError, match="password refused"):
        sluice("user", "add", "weak", "--role", "viewer", "--password-stdin", stdin="password\n")
    assert not User.objects.filter(username="weak").exists()


def test_password_from_stdin_and_a_warning_for_the_command_line(transactional_db):
    sluice("user", "add", "stdin-user", "--role", "viewer", "--password-stdin", stdin=GOOD_PASSWORD + "\n")
    assert User.objects.get(username="stdin-user").check_password(GOOD_PASSWORD)
    _, err = sluice("user", "add", "argv-user", "--role", "viewer", "--password", GOOD_PASSWORD)
    assert "--password-stdin" in err and User.objects.get(username="argv-user").check_password(GOOD_PASSWORD)


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_login_is_throttled_after_repeated_failures(transactional_db, settings, path):
    user = make_user("operator")
    user.is_staff = True
    user.save()
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert client.post(path, {"username": user.username, "password": "wrong"}).status_code == 200
    assert client.post(path, {"username": user.username, "password": "wrong"}).status_code == 429
    # Locked out: even the right password is refused now, with 429 and a page that says why.
    locked = client.post(path, {"username": user.username, "password": PASSWORD})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert "_auth_user_id" not in client.session
    # Another account from the same address is not locked out.
    other = make_user("viewer")
    assert client.post("/accounts/login/", {"username": other.username, "password": PASSWORD}).status_code == 302


@override_settings(SLUICE_API_RATE_ANON="3/min", SLUICE_API_RATE_USER="4/min")
def test_the_api_is_throttled(transactional_db):
    """Wrong tokens per address (DRF's throttles run only after a login succeeded), then
    requests per user, at the rates of Sluice's own settings (no REST_FRAMEWORK block)."""
    viewer = make_user("viewer")
    _, key = tokens.issue(viewer)
    guesses = [Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token guess-{i}") for i in range(3)]
    assert [r.status_code for r in guesses] == [401, 401, 401]
    # Blocked before the token is looked at: the right one does not get through either.
    blocked = Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}")
    assert blocked.status_code == 429 and "error" in blocked.json() and blocked["Retry-After"]
    caches["default"].clear()
    client = Client()
    client.force_login(viewer)
    answers = [client.get("/api/queues/").status_code for _ in range(5)]
    assert answers == [200, 200, 200, 200, 429]


# -- 9: tokens -----------------------------------------------------------------------------------------

def test_tokens_are_hashed_expire_and_are_revoked_with_an_audit_trail(transactional_db):
    viewer = make_user("viewer")
    out, _ = sluice("user", "token", viewer.username, "--json")
    key = json.loads(out)["token"]
    row = ApiToken.objects.get(user=viewer)
    assert row.digest != key and key not in row.digest and row.prefix == key[:8]
    ok = Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}")
    assert ok.status_code == 200
    # Expired: refused.
    ApiToken.objects.filter(pk=row.pk).update(expires=timezone.now() - dt.timedelta(seconds=1))
    assert Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    # Revoked: refused.
    _, key2 = tokens.issue(viewer)
    out, _ = sluice("user", "token", viewer.username, "--revoke", "--json")
    assert json.loads(out) == {"user": viewer.username, "revoked": 1}
    assert Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key2}").status_code == 401
    trail = list(AuditEntry.objects.filter(via="cli").order_by("id").values_list("action", "target", "outcome"))
    assert trail == [("issue_token", f"user {viewer.username}", "ok"), ("revoke_token", f"user {viewer.username}", "ok")]


def test_role_changes_and_disabling_are_audited(transactional_db):
    sluice("user", "add", "dora", "--role", "viewer", "--password", GOOD_PASSWORD)
    sluice("user", "add", "dora", "--role", "operator", "--password", GOOD_PASSWORD, "--update")
    _, key = tokens.issue(User.objects.get(username="dora"))
    client = Client()
    assert client.post("/accounts/login/", {"username": "dora", "password": GOOD_PASSWORD}).status_code == 302
    out, _ = sluice("user", "disable", "dora", "--json")
    assert json.loads(out) == {"user": "dora", "active": False, "revoked": 1}
    # The open session and the token stop working; a new login is refused.
    assert client.get("/").status_code == 302
    assert Client().get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    assert Client().post("/accounts/login/", {"username": "dora", "password": GOOD_PASSWORD}).status_code == 200
    entries = list(AuditEntry.objects.filter(via="cli").order_by("id"))
    assert [e.action for e in entries] == ["set_role", "set_role", "disable_user"]
    assert "viewer → operator" in entries[1].detail and entries[0].username.endswith("(cli)")


def test_the_admin_shows_no_token_secret(transactional_db):
    admin = User.objects.create_superuser("root", password=PASSWORD)
    token, key = tokens.issue(admin)
    client = Client()
    client.force_login(admin)
    listing = client.get("/admin/dashboard/apitoken/")
    assert listing.status_code == 200 and token.prefix.encode() in listing.content
    detail = client.get(f"/admin/dashboard/apitoken/{token.pk}/change/")
    for page in (listing, detail):
        assert key.encode() not in page.content and token.digest.encode() not in page.content
    assert client.get("/admin/authtoken/").status_code == 404  # DRF's plain-text token table is gone


def test_role_changes_in_the_admin_are_audited(transactional_db):
    from django.contrib.auth.models import Group

    root = User.objects.create_superuser("root", password=PASSWORD)
    vera = make_user("viewer")
    client = Client()
    client.force_login(root)
    operator_group = Group.objects.get_or_create(name="sluice-operator")[0]
    form = {"username": vera.username, "first_name": "", "last_name": "", "email": "", "is_active": "on",
            "groups": [operator_group.pk], "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2026-01-01", "initial-date_joined_1": "00:00:00"}
    response = client.post(f"/admin/auth/user/{vera.pk}/change/", form)
    assert response.status_code == 302, response.content[:2000]
    form.pop("is_active")
    assert client.post(f"/admin/auth/user/{vera.pk}/change/", form).status_code == 302
    entries = list(AuditEntry.objects.order_by("id").values_list("username", "action", "via", "detail"))
    assert entries == [("root", "set_role", "admin", "role viewer → operator, active"),
                       ("root", "disable_user", "admin", "role operator → none, inactive")]


# -- 10: /healthz and /api/schema/ ----------------------------------------------------------------------

def test_healthz_tells_strangers_the_status_only(transactional_db, viewer_client):
    anonymous = Client().get("/healthz")
    assert anonymous.status_code == 200 and set(anonymous.json()) == {"status"}
    details = viewer_client.get("/healthz").json()
    assert {"status", "database", "redis", "workers"} <= set(details)


def test_the_schema_needs_a_login(transactional_db, viewer_client):
    anonymous = Client().get("/api/schema/?format=json")
    assert anonymous.status_code == 401 and "error" in anonymous.json()
    assert viewer_client.get("/api/schema/?format=json").status_code == 200


# -- 11: headers, sessions, hosts, redirects ------------------------------------------------------------

def test_pages_carry_a_strict_csp_and_a_permissions_policy(viewer_client):
    response = viewer_client.get("/")
    policy = dict(part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'" and "unsafe" not in policy["script-src"]
    assert policy["default-src"] == "'self'" and policy["frame-ancestors"] == "'none'"
    assert "camera=()" in response["Permissions-Policy"]
    # The htmx trigger filter that needed eval is gone; htmx is told not to eval.
    html = response.content.decode()
    assert "[document.visibilityState" not in html and '"allowEval": false' in html
    assert "<script>" not in html and " on" + "click=" not in html


def test_sessions_end_after_idling(settings, viewer_client):
    assert settings.SESSION_SAVE_EVERY_REQUEST is True and settings.SESSION_COOKIE_AGE == 3600
    response = viewer_client.get("/")
    assert response.cookies["sessionid"]["max-age"] == 3600  # renewed by every request


def test_testserver_is_not_an_allowed_host_by_default():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOWED_HOSTS"}
    code = "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='sluice.settings'; " \
           "from django.conf import settings; print(settings.ALLOWED_HOSTS)"
    printed = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    assert "testserver" not in printed and "127.0.0.1" in printed


@pytest.mark.parametrize("target", ["/\\evil.example/", "//evil.example/", "https://evil.example/", "/\\/evil"])
def test_next_cannot_leave_the_site(operator_client, make_queue, target):
    name = make_queue()
    Transport().send(name, "x", message_id="m-1")
    response = operator_client.post(f"/queues/{name}/delete/", {"ids": ["m-1"], "next": target})
    assert response.status_code == 303 and response["Location"] == f"/queues/{name}/"


# -- 13: authorization before validation -----------------------------------------------------------------

API_WRITES = [
    ("delete", "/api/queues/q/messages/m/"), ("post", "/api/queues/q/messages/m/move/"),
    ("post", "/api/queues/q/purge/"), ("post", "/api/delayed/d/deliver-now/"), ("delete", "/api/delayed/d/"),
    ("post", "/api/failed/retry/"), ("post", "/api/failed/archive/"), ("post", "/api/failed/restore/"),
    ("post", "/api/failed/delete/"), ("post", "/api/failed/1/edit-retry/"), ("post", "/api/outbox/o/dispatch/"),
    ("post", "/api/metrics/run/"),
]


@pytest.mark.parametrize("method,path", API_WRITES)
@pytest.mark.parametrize("body", ["{not json", '["a list"]', "{}"])
def test_a_viewers_forged_api_request_is_403_and_audited(viewer_client, viewer, method, path, body):
    response = getattr(viewer_client, method)(path, body, content_type="application/json")
    assert response.status_code == 403 and "operators" in response.json()["error"]
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.outcome, entry.via) == (viewer.username, "denied", "api")


PAGE_WRITES = ["/queues/q/delete/", "/queues/q/purge/", "/queues/q/move/", "/delayed/d/deliver-now/",
               "/delayed/d/delete/", "/failed/retry/", "/failed/archive/", "/failed/restore/", "/failed/delete/",
               "/failed/999999/edit/", "/outbox/o/dispatch/", "/metrics/charts/run/"]


@pytest.mark.parametrize("path", PAGE_WRITES)
def test_a_viewers_forged_form_post_is_403_and_audited(viewer_client, viewer, path):
    response = viewer_client.post(path, {})  # nothing selected, nothing there: still 403
    assert response.status_code == 403
    entry = AuditEntry.objects.get()
    assert (entry.username, entry.outcome, entry.via) == (viewer.username, "denied", "web")


# -- 14: the API's errors and pagination --------------------------------------------------------------

@pytest.mark.parametrize("path", ["/api/nothing/", "/api/failed/abc/", "/api/", "/api/queues"])
def test_unknown_api_paths_answer_json(viewer_client, path):
    for method in ("get", "post", "delete"):
        response = getattr(viewer_client, method)(path)
        assert response.status_code == 404 and response["Content-Type"] == "application/json"
        assert "error" in response.json()


def test_the_schema_documents_the_real_status_codes(viewer_client):
    schema = viewer_client.get("/api/schema/?format=json").json()
    paths = schema["paths"]
    delete = paths["/api/queues/{name}/messages/{message_id}/"]["delete"]["responses"]
    assert "200" in delete and "204" not in delete
    assert "properties" in schema["components"]["schemas"]["Deleted"]
    for bulk in ("retry", "archive", "restore"):
        assert "202" in paths[f"/api/failed/{bulk}/"]["post"]["responses"]
        assert "200" not in paths[f"/api/failed/{bulk}/"]["post"]["responses"]
    assert "202" in paths["/api/metrics/run/"]["post"]["responses"]
    error = {"$ref": "#/components/schemas/Error"}
    for path, operations in paths.items():
        for method, operation in operations.items():
            codes = operation["responses"]
            assert {"401", "403", "429"} <= set(codes), (method, path)
            for code, answer in codes.items():
                if code >= "400":
                    assert answer["content"]["application/json"]["schema"] == error, (method, path, code)
    assert {p["name"] for p in paths["/api/failed/"]["get"]["parameters"]} >= {"cursor", "limit"}
    assert {p["name"] for p in paths["/api/audit/"]["get"]["parameters"]} >= {"cursor", "limit"}


@pytest.mark.parametrize("since", ["0133-03-04T19:22:05-23:45", "0001-01-01T00:00:00+05:00"])
def test_times_with_any_offset_are_answered(viewer_client, since):
    """Found by schemathesis on PostgreSQL: an offset beyond ±15:59 was a 503 there."""
    for path in ("/api/audit/", "/api/failed/"):
        status, body = api(viewer_client, "get", f"{path}?since={since.replace('+', '%2B')}")
        assert status in (200, 400), body


@pytest.mark.parametrize("path", ["/api/metrics/?message_type=a%00b", "/api/failed/?q=%00", "/api/audit/?us%00er=x"])
def test_nul_in_a_query_parameter_is_a_400(viewer_client, path):
    """Found by schemathesis on PostgreSQL (which refuses NUL in text): a 503 there."""
    status, body = api(viewer_client, "get", path)
    assert status == 400 and "NUL" in body["error"]


def test_failed_and_audit_lists_page_by_cursor(operator_client, make_queue, error_queue):
    queue = make_queue()
    made = {fail_message(queue, message_id=f"m-{i}").pk for i in range(7)}
    seen, cursor = [], None
    while True:
        status, body = api(operator_client, "get", f"/api/failed/?limit=3&queue={queue}"
                                                   + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200 and body["count"] == 7
        seen += [r["id"] for r in body["results"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 7 and set(seen) == made
    status, body = api(operator_client, "get", "/api/failed/?cursor=not-a-cursor")
    assert status == 400 and "cursor" in body["error"]
    for i in range(5):
        AuditEntry.objects.create(action="retry_failed", outcome="ok", username=f"u{i}")
    status, first = api(operator_client, "get", "/api/audit/?limit=2")
    status, second = api(operator_client, "get", f"/api/audit/?limit=2&cursor={first['next_cursor']}")
    users = [e["user"] for e in first["entries"] + second["entries"]]
    assert users == ["u4", "u3", "u2", "u1"] and second["next_cursor"]
    for i in range(3):
        BulkOperation.objects.create(kind="retry", description=f"op {i}")
    status, first = api(operator_client, "get", "/api/operations/?limit=2")
    status, second = api(operator_client, "get", f"/api/operations/?limit=2&cursor={first['next_cursor']}")
    assert [o["description"] for o in first["operations"] + second["operations"]] == ["op 2", "op 1", "op 0"]
    assert second["next_cursor"] is None
