"""Fixtures and helpers of the dashboard page tests (test client and browser): users with a
role, failed messages made the real way (error queue → ingestion), hostile message data."""
from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from core import failures
from core.messages import Headers, wire_time
from core.models import FailedMessage
from tests.conftest import put_row

PASSWORD = "pass-word-123"
#: Message data that must stay inert on every page: a script tag and an attribute break-out.
XSS_SCRIPT = "<script>window.__pwned = 1</script>"
XSS_IMG = '"><img src=x onerror="window.__pwned=2">'
#: How they look escaped by Django.
XSS_SCRIPT_ESCAPED = "&lt;script&gt;window.__pwned = 1&lt;/script&gt;"
XSS_IMG_ESCAPED = "&quot;&gt;&lt;img src=x onerror=&quot;window.__pwned=2&quot;&gt;"


def make_user(role: str | None, name: str | None = None) -> User:
    """A user in ``sluice-<role>`` (None: no Sluice group) with PASSWORD."""
    user = User.objects.create_user(name or f"{role or 'nobody'}_{uuid.uuid4().hex[:6]}", password=PASSWORD)
    if role:
        user.groups.add(Group.objects.get_or_create(name=f"sluice-{role}")[0])  # a flush drops the migration's rows
    return user


@pytest.fixture(autouse=True)
def _fresh_dashboard_cache():
    """The overview's snapshot is cached for a few seconds (shared through Redis): every test
    starts without one."""
    from dashboard.counting import stats

    stats.clear_cache()
    yield
    stats.clear_cache()


@pytest.fixture
def operator(transactional_db) -> User:
    return make_user("operator")


@pytest.fixture
def viewer(transactional_db) -> User:
    return make_user("viewer")


@pytest.fixture
def operator_client(operator) -> Client:
    """A test client logged in as an operator (its own: a test may use a viewer's beside it)."""
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(viewer) -> Client:
    client = Client()
    client.force_login(viewer)
    return client


def fail_message(queue: str, body: bytes | str = b'{"order": 7}', *, exception_type: str = "ValueError",
                 exception_message: str = "bad order", frame: str = "handle", message_type: str = "PlaceOrder",
                 headers: dict[str, str] | None = None, message_id: str | None = None,
                 failed_at: dt.datetime | None = None) -> FailedMessage:
    """Put a failed copy of a message into the error queue, with the headers recoverability
    writes, and ingest it: the record the pages show."""
    message_id = message_id or str(uuid.uuid4())
    when = failed_at or dt.datetime.now(dt.timezone.utc)
    trace = (f'Traceback (most recent call last):\n  File "/app/shop/handlers.py", line 12, in {frame}\n'
             f"    raise {exception_type}('{exception_message}')\n{exception_type}: {exception_message}")
    all_headers = {
        Headers.EXCEPTION_TYPE: exception_type, Headers.EXCEPTION_MESSAGE: exception_message,
        Headers.EXCEPTION_STACK_TRACE: trace, Headers.FAILED_Q: queue, Headers.TIME_OF_FAILURE: wire_time(when),
        Headers.TOTAL_FAILED_ATTEMPTS: "6", **(headers or {}),
    }
    put_row("error", body, message_type=message_type, message_id=message_id, headers=all_headers)
    failures.ingest_errors()
    return FailedMessage.objects.get(message_id=message_id)
