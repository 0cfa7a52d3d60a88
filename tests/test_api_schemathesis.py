"""Schemathesis against a live server (issue 20 item 15): for every operation of the API's
OpenAPI schema, a bounded number of generated requests as a viewer and as an operator.
Every answer must be documented (status code, content type, body shape) and none may be a
5xx.  The schema is the one /api/schema/ serves (drf-spectacular, dashboard/api/schema.py)."""
from __future__ import annotations

import os

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    ignored_auth, missing_required_header, negative_data_rejection, positive_data_acceptance,
)

from core.delayed import delayed_store
from core.queues import create_queue
from core.transport import Transport
from core.models import BulkOperation
from dashboard.security import tokens
from dashboard.models import AuditEntry
from tests.conftest import database_vendor
from tests.dashboard_pages_support import fail_message, make_user

#: Generated requests per operation and role (SLUICE_SCHEMATHESIS_EXAMPLES to go further):
#: 10 on SQLite, 5 on a server database, where each request costs about twice as much and
#: the API's code paths are the same (only core.dialects' SQL differs, which 5 reach).
EXAMPLES = int(os.environ.get("SLUICE_SCHEMATHESIS_EXAMPLES", "10" if database_vendor() == "sqlite" else "5"))

# The same document /api/schema/ answers, built in-process: the test module is collected
# before any server runs.
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))


@pytest.fixture
def seeded(live_server, error_queue):
    """A queue with a message, the error queue and the delayed store, so that some generated
    requests find data."""
    delayed_store().setup_infrastructure()
    create_queue("orders")
    Transport().send("orders", '{"order": 1}', message_id="m-1")
    Transport().send("orders", '{"order": 2}', message_id="d-1", delay=3600)
    record = fail_message("orders", message_id="f-1")
    AuditEntry.objects.create(action="retry_failed", outcome="ok", username="someone", target_ids=[str(record.pk)])
    BulkOperation.objects.create(kind="retry", description="seeded", requested_by="someone")
    return live_server.url


@pytest.fixture
def api_key(role, seeded) -> str:
    return tokens.issue(make_user(role))[1]


@pytest.mark.parametrize("role", ["viewer", "operator"])
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_the_api_keeps_to_its_schema(case, role, seeded, api_key):
    case.call_and_validate(base_url=seeded, headers={"Authorization": f"Token {api_key}"},
                           excluded_checks=excluded(case))


def excluded(case) -> list:
    """"Schema-valid data must be accepted" holds for the reads' parameters (bounds and choices
    are in the schema), not where validity depends on data: an action's selection (an empty one
    is a 400, and so is an id with control characters) or a cursor string this API never gave out."""
    found = []
    if case.method.upper() != "GET" or (case.query or {}).get("cursor"):
        found.append(positive_data_acceptance)
    # The test sends the token with every case: one made invalid by leaving Authorization out
    # (and by whatever else it varied alongside) is sent authenticated, so "invalid data must
    # be rejected" does not hold for it.
    header = (getattr(getattr(case, "meta", None), "components", None) or {}).get(ParameterLocation.HEADER)
    if header is not None and header.mode == GenerationMode.NEGATIVE:
        found.append(negative_data_rejection)
    return found


# -- every write under a viewer's session, with its CSRF token (issue 35 item 5) -----------------

#: The API's writes: a viewer's session may reach each of them past CSRF, never past its role.
writes = schema.include(method=["POST", "PUT", "PATCH", "DELETE"])


@pytest.fixture
def viewer_session(seeded) -> dict[str, dict[str, str]]:
    """A viewer's session cookie and a CSRF token (cookie and header), as a browser holds
    them: the test client's own calls skip CSRF, these do not."""
    from django.conf import settings as django_settings
    from django.middleware.csrf import _get_new_csrf_string
    from django.test import Client

    client = Client()
    client.force_login(make_user("viewer"))
    token = _get_new_csrf_string()
    return {"cookies": {django_settings.SESSION_COOKIE_NAME: client.cookies[django_settings.SESSION_COOKIE_NAME].value,
                        django_settings.CSRF_COOKIE_NAME: token},
            "headers": {"X-CSRFToken": token}}


@writes.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_a_viewers_session_writes_are_refused_and_audited(case, seeded, viewer_session):
    """Whatever the body (schemathesis generates valid and invalid ones), a viewer's write is
    a 403 written to the audit log as denied, or a 404 for a path no route takes: the role
    is checked before the body is read, and no body makes a 5xx."""
    denied = AuditEntry.objects.filter(outcome="denied").count()
    response = case.call(base_url=seeded, **viewer_session)
    assert response.status_code < 500, (case.method, response.status_code, response.text[:300])
    if case.method.upper() not in ("POST", "PUT", "PATCH", "DELETE"):
        return  # the coverage phase tries other methods too (OPTIONS describes the endpoint)
    assert response.status_code in (403, 404), (response.status_code, response.text[:300])
    if response.status_code == 403:
        assert "CSRF" not in response.text, response.text[:300]
        assert AuditEntry.objects.filter(outcome="denied").count() == denied + 1
    # The session stands in for the schema's token scheme: its "no Authorization header must be
    # a 401" checks do not apply to a request the session authenticates.
    case.validate_response(response, excluded_checks=[positive_data_acceptance, missing_required_header,
                                                      ignored_auth])
