"""Alerts as code (`sluice alerts import|export|evaluate`, SLUICE_ALERTS_CONFIG), the beat task
for pools without loops, and the retry timing rules of deliveries."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from core.alerts.sending import backoff, retry_after_seconds
from core.models.alerts import AlertRule, AlertTarget

CONFIG = {"targets": [{"name": "am", "url": "http://alertmanager.example.test:9093/api/v2/alerts",
                       "headers": {"Authorization": "Bearer cli-secret-5"}}],
          "rules": [{"name": "redis", "kind": "redis_down", "severity": "critical", "targets": ["am"]}]}


def sluice(*args: str) -> str:
    out = io.StringIO()
    call_command("sluice", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_import_from_a_file_or_the_setting_then_export_without_secrets(tmp_path, settings):
    path = tmp_path / "alerts.json"
    path.write_text(json.dumps(CONFIG))
    assert json.loads(sluice("alerts", "import", str(path))) == {"targets": 1, "rules": 1}
    assert AlertRule.objects.get().targets.get().name == "am"
    settings.SLUICE_ALERTS_CONFIG = json.dumps({"rules": [{"name": "redis", "kind": "redis_down",
                                                           "severity": "warning"}]})
    sluice("alerts", "import")  # updates by name
    assert AlertRule.objects.get().severity == "warning"
    exported = sluice("alerts", "export")
    assert "cli-secret-5" not in exported and "alertmanager.example.test" not in exported
    assert json.loads(exported)["rules"][0]["name"] == "redis"


@pytest.mark.django_db(transaction=True)
def test_a_bad_file_imports_nothing(tmp_path):
    path = tmp_path / "alerts.json"
    path.write_text(json.dumps({"targets": CONFIG["targets"], "rules": [{"name": "x", "kind": "queue_length",
                                                                        "targets": ["nobody"]}]}))
    with pytest.raises(CommandError, match="no target named nobody"):
        sluice("alerts", "import", str(path))
    assert not AlertTarget.objects.exists()
    path.write_text("{not json")
    with pytest.raises(CommandError, match="not JSON"):
        sluice("alerts", "import", str(path))


@pytest.mark.django_db(transaction=True)
def test_evaluate_now_and_the_beat_task(settings):
    from workers.tasks import evaluate_alerts

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens: the redis_down rule fires
    sluice("alerts", "import", json.dumps(CONFIG))
    assert json.loads(sluice("alerts", "evaluate"))["rules"] == 1
    assert AlertRule.objects.get().alerts.get().state == "firing"
    assert evaluate_alerts() == {"rules": 1, "notifications": 0}  # already announced


def test_retry_after_is_honoured_up_to_the_cap_and_backoff_grows_with_jitter(settings):
    settings.SLUICE_ALERTS_RETRY_BASE = 1.0
    settings.SLUICE_ALERTS_RETRY_CAP = 15.0
    assert backoff(1, 3.0) == 3.0 and backoff(1, 120.0) == 15.0
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds("soon") is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: now
    firsts = {round(backoff(1, None), 3) for _ in range(20)}
    assert all(0.5 <= f <= 1.0 for f in firsts) and len(firsts) > 1  # jitter
    assert all(4.0 <= backoff(4, None) <= 8.0 for _ in range(20)) and backoff(10, None) <= 15.0
