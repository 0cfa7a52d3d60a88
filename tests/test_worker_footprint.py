"""What a queue worker carries: `sluice worker` serves queues, so it loads none of the web
side (the dashboard's views and API, DRF's serializers and views, drf-spectacular's schema
machinery, Django's test client) and not Celery, which only the dashboard's bulk actions
use.  The system checks that would load them (URLs, templates, the admin's) are the web's
and are skipped by the worker; every other command runs all checks."""
from __future__ import annotations

import json

import pytest

from core.queues import create_queue
from core.transport import Transport
from tests.conftest import manage, start_worker, wait_for

#: Prefixes of modules a worker must not load, and why each would be there.
WEB_SIDE = {
    "dashboard.views": "the pages (URL checks import every view)",
    "dashboard.api": "the JSON API",
    "dashboard.actions": "the operator actions (the app's audit receivers live in dashboard.security.audit_log)",
    "dashboard.security.permissions": "the pages' and DRF's role checks (the admin asks dashboard.security.roles)",
    "dashboard.security.tokens": "DRF's token authentication (`sluice user` manages keys in token_keys)",
    "rest_framework.permissions": "DRF's permission classes",
    "rest_framework.authentication": "DRF's authentication classes",
    "rest_framework.serializers": "DRF beyond its app config (template libraries, the API)",
    "rest_framework.views": "DRF's views",
    "drf_spectacular.plumbing": "the OpenAPI schema machinery",
    "django.test": "Django's test client (drf-spectacular imports it)",
    "celery": "the dashboard's producer of bulk operations",
    "requests": "DRF's template tags",
}


@pytest.mark.django_db(transaction=True)
def test_a_worker_loads_none_of_the_web_side(tmp_path):
    create_queue("footprint")
    worker = start_worker("--queue", "footprint", env={"SLUICE_HANDLER_MODULES": "tests.modules_handlers"})
    try:
        report = tmp_path / "modules.json"
        Transport().send("footprint", {"path": str(report)}, message_type="Modules")
        wait_for(report.exists, timeout=60, what="the worker's list of modules")
        loaded = json.loads(wait_for(lambda: report.read_text(), what="the list written"))
    finally:
        worker.terminate()
        worker.wait(30)
    assert "core.worker" in loaded  # the list is the worker's
    found = {prefix: why for prefix, why in WEB_SIDE.items()
             if any(m == prefix or m.startswith(prefix + ".") for m in loaded)}
    assert not found, f"a queue worker loaded: {found}"


@pytest.mark.django_db(transaction=True)
def test_other_commands_run_every_system_check(settings):
    # A URL pattern whose view cannot be imported is an error the URL checks report.
    result = manage("sluice", "queue", "list", env={"DJANGO_SETTINGS_MODULE": "tests.broken_urls_settings"})
    assert result.returncode != 0 and b"urls.E008" in result.stderr, result.stderr.decode()
