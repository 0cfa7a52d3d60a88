"""E-mail for a deployment configured by environment variables (Docker, `make run`): the
bundled project reads EMAIL_* (or one EMAIL_URL), so an alert's e-mail reaches the server
they name, and the password is never printed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sluice.dburl import DatabaseUrlError, parse_email_url
from tests.alerts_support import SmtpReceiver
from tests.conftest import ROOT

#: Runs in a process of its own, as a worker would: the settings read the environment at import.
SEND = """
import django, os
os.environ["DJANGO_SETTINGS_MODULE"] = "sluice.settings"
django.setup()
from core.alerts.sending import send_email
from django.conf import settings
attempt = send_email(["ops@example.test"], "[FIRING] backlog", "the backlog grew", 10)
print(attempt.ok, attempt.error, settings.EMAIL_HOST_USER)
"""


def send_from_a_process(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EMAIL_")}
    return subprocess.run([sys.executable, "-c", SEND], cwd=ROOT, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.no_database
def test_an_alert_email_reaches_the_smtp_server_the_environment_names():
    with SmtpReceiver() as smtp:
        result = send_from_a_process({"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp.port),
                                      "DEFAULT_FROM_EMAIL": "sluice@example.test"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == "True", result.stdout
    (sender, rcpts, content), = smtp.messages
    assert sender == "sluice@example.test" and rcpts == ["ops@example.test"]
    assert "[FIRING] backlog" in content


@pytest.mark.no_database
def test_email_url_gives_every_part_and_the_password_is_not_printed():
    with SmtpReceiver() as smtp:
        result = send_from_a_process({"EMAIL_URL": f"smtp://alerts%40example.test:s3cret-pw@127.0.0.1:{smtp.port}",
                                      "DEFAULT_FROM_EMAIL": "sluice@example.test"})
    # aiosmtpd offers no AUTH on a plain port: the login is refused, and what is said names
    # the user, never the password.
    assert result.stdout.split()[-1] == "alerts@example.test", result.stdout
    assert "s3cret-pw" not in result.stdout + result.stderr


@pytest.mark.no_database
def test_email_url_forms():
    assert parse_email_url("") == ("localhost", 25, "", "", False, False)
    assert parse_email_url("smtp://u:p@mail.example:587?tls=1") == ("mail.example", 587, "u", "p", True, False)
    assert parse_email_url("smtps://mail.example") == ("mail.example", 465, "", "", False, True)
    with pytest.raises(DatabaseUrlError) as refused:
        parse_email_url("http://u:hunter2@mail.example")
    assert "hunter2" not in str(refused.value)
