"""`sluice user add|token|list`."""
from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.authtoken.models import Token

from dashboard.permissions import can_act, can_view


def sluice(*args: str) -> str:
    out = io.StringIO()
    call_command("sluice", *args, stdout=out)
    return out.getvalue()


def test_add_viewer_and_operator(db):
    sluice("user", "add", "vera", "--role", "viewer", "--password", "pw-1")
    out = json.loads(sluice("user", "add", "otto", "--role", "operator", "--password", "pw-2", "--json"))
    assert out == {"user": "otto", "role": "operator", "created": True}
    vera, otto = authenticate(username="vera", password="pw-1"), authenticate(username="otto", password="pw-2")
    assert can_view(vera) and not can_act(vera) and can_act(otto)


def test_an_existing_user_needs_update(db):
    sluice("user", "add", "admin", "--role", "viewer", "--password", "old")
    with pytest.raises(CommandError, match="exists; add --update"):
        sluice("user", "add", "admin", "--role", "operator", "--password", "new")
    assert authenticate(username="admin", password="old") is not None
    sluice("user", "add", "admin", "--role", "operator", "--password", "new", "--update")
    admin = authenticate(username="admin", password="new")
    assert can_act(admin) and list(admin.groups.values_list("name", flat=True)) == ["sluice-operator"]


def test_no_password_and_no_terminal_is_an_error(db, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandError, match="give --password"):
        sluice("user", "add", "bob", "--role", "viewer")
    assert not User.objects.filter(username="bob").exists()


def test_prompted_password(db, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    answers = iter(["s3cret", "s3cret"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    sluice("user", "add", "pia", "--role", "viewer")
    assert authenticate(username="pia", password="s3cret") is not None


def test_token_is_created_once_and_works(db, client):
    sluice("user", "add", "bot", "--role", "viewer", "--password", "x")
    key = sluice("user", "token", "bot").strip()
    assert key == sluice("user", "token", "bot").strip() == Token.objects.get(user__username="bot").key
    data = json.loads(sluice("user", "token", "bot", "--json"))
    assert data["token"] == key and data["role"] == "viewer" and data["created"] is False
    assert client.get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    new = sluice("user", "token", "bot", "--reset").strip()
    assert new != key and client.get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code in (401, 403)
    with pytest.raises(CommandError, match="no user"):
        sluice("user", "token", "nobody")


def test_list(db):
    sluice("user", "add", "vera", "--role", "viewer", "--password", "x")
    rows = json.loads(sluice("user", "list", "--json"))
    assert [(r["user"], r["role"]) for r in rows] == [("vera", "viewer")]
