"""`sluice user add|token|list`."""
from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from dashboard.security.permissions import can_act, can_view

# Passwords Django's validators accept (length, not common, not numeric, unlike the name).
PW1, PW2, PW3 = "tidal-basin-7304", "ferry-lantern-5521", "gravel-orchid-9190"


def authenticate(username: str, password: str):
    """The user when the password is theirs (no login: django-axes wants a request there)."""
    user = User.objects.filter(username=username).first()
    return user if user is not None and user.check_password(password) else None


def sluice(*args: str) -> str:
    out = io.StringIO()
    call_command("sluice", *args, stdout=out)
    return out.getvalue()


def test_add_viewer_and_operator(db):
    sluice("user", "add", "vera", "--role", "viewer", "--password", PW1)
    out = json.loads(sluice("user", "add", "otto", "--role", "operator", "--password", PW2, "--json"))
    assert out == {"user": "otto", "role": "operator", "created": True}
    vera, otto = authenticate(username="vera", password=PW1), authenticate(username="otto", password=PW2)
    assert can_view(vera) and not can_act(vera) and can_act(otto)


def test_an_existing_user_needs_update(db):
    sluice("user", "add", "admin", "--role", "viewer", "--password", PW1)
    with pytest.raises(CommandError, match="exists; add --update"):
        sluice("user", "add", "admin", "--role", "operator", "--password", PW2)
    assert authenticate(username="admin", password=PW1) is not None
    sluice("user", "add", "admin", "--role", "operator", "--password", PW2, "--update")
    admin = authenticate(username="admin", password=PW2)
    assert can_act(admin) and list(admin.groups.values_list("name", flat=True)) == ["sluice-operator"]


def test_no_password_and_no_terminal_is_an_error(db, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandError, match="give --password"):
        sluice("user", "add", "bob", "--role", "viewer")
    assert not User.objects.filter(username="bob").exists()


def test_prompted_password(db, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    answers = iter([PW3, PW3])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    sluice("user", "add", "pia", "--role", "viewer")
    assert authenticate(username="pia", password=PW3) is not None


def test_tokens_are_issued_and_reset(db, client):
    """Tokens are stored hashed: each call issues a new key (shown once); --reset revokes the others."""
    sluice("user", "add", "bot", "--role", "viewer", "--password", PW1)
    key = sluice("user", "token", "bot").strip()
    data = json.loads(sluice("user", "token", "bot", "--json"))
    assert data["token"] != key and data["role"] == "viewer" and data["created"] is True and data["expires"]
    assert client.get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    new = sluice("user", "token", "bot", "--reset").strip()
    assert new != key and client.get("/api/queues/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 401
    assert client.get("/api/queues/", HTTP_AUTHORIZATION=f"Token {new}").status_code == 200
    with pytest.raises(CommandError, match="no user"):
        sluice("user", "token", "nobody")


def test_list(db):
    sluice("user", "add", "vera", "--role", "viewer", "--password", PW1)
    rows = json.loads(sluice("user", "list", "--json"))
    assert [(r["user"], r["role"]) for r in rows] == [("vera", "viewer")]
