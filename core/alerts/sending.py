"""One attempt to reach one target: an HTTP POST (webhooks) or an SMTP session (Django's
email backend), with a timeout.  No database work happens here, and none may be open
around it: core.alerts.delivery calls :func:`attempt_delivery` only with no transaction
open, on a thread of its own.

Nothing here logs or stores a target's URL, headers or routing key: errors pass through
:func:`redact` first.
"""
from __future__ import annotations

import email.utils
import json
import random
import smtplib
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from django.core.mail import EmailMessage, get_connection
from django.utils import timezone

from core.models.alerts import AlertDelivery, AlertTarget
from core.alerts.payloads import email_text, notice, webhook_body
from core.conf import get_settings

#: Answers are read up to this many bytes (kept in the delivery's error, redacted: no more of
#: what a target answers is shown).
SNIPPET = 300


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended: ``retryable`` failures (network, timeout, 408, 429, 5xx, SMTP
    4xx) are tried again, after ``retry_after`` seconds when the target said so."""

    ok: bool
    retryable: bool = False
    retry_after: float | None = None
    error: str = ""


def redact(text: str, target: AlertTarget) -> str:
    """``text`` without the target's secrets (AlertTarget.secrets), also where an answer cut
    at SNIPPET bytes ends inside one: a tail that begins a secret goes too."""
    secrets = target.secrets()
    for secret in secrets:
        text = text.replace(secret, "[secret]")
    for secret in secrets:
        for n in range(min(len(secret) - 1, len(text)), 3, -1):
            if text.endswith(secret[:n]):
                return text[:-n] + "[secret]"
    return text


def _answer(raw: bytes) -> str:
    """What of a target's answer is kept: its first SNIPPET bytes on one line (control
    characters and runs of spaces collapsed), for the error shown on pages and in logs."""
    return " ".join(raw[:SNIPPET].decode("utf-8", "replace").split())


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: a number, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((when - timezone.now()).total_seconds(), 0.0) if when.tzinfo else None


def backoff(attempt: int, retry_after: float | None) -> float:
    """Seconds before attempt ``attempt + 1``: the target's Retry-After when it gave one,
    else exponential with full jitter; never more than the cap."""
    s = get_settings()
    if retry_after is not None:
        return min(retry_after, s.ALERTS_RETRY_CAP)
    ceiling = min(s.ALERTS_RETRY_BASE * 2 ** (attempt - 1), s.ALERTS_RETRY_CAP)
    return random.uniform(ceiling / 2, ceiling)


def post_json(url: str, headers: dict[str, str], body: Any, timeout: float) -> Attempt:
    request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "Sluice-Alerts/1", **{str(k): str(v) for k, v in headers.items()}})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(SNIPPET)
        return Attempt(True)
    except urllib.error.HTTPError as exc:
        snippet = _answer(exc.read(SNIPPET)) if exc.fp else ""
        retryable = exc.code in (408, 429) or exc.code >= 500
        return Attempt(False, retryable, retry_after_seconds(exc.headers.get("Retry-After")),
                       f"HTTP {exc.code}: {snippet}".strip())
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, DNS, timeout
        reason = getattr(exc, "reason", exc)
        return Attempt(False, True, None, f"network error: {type(reason).__name__}: {reason}")


def send_email(recipients: list[str], subject: str, body: str, timeout: float) -> Attempt:
    try:
        connection = get_connection(timeout=timeout)
        EmailMessage(subject, body, to=recipients, connection=connection).send()
        return Attempt(True)
    except smtplib.SMTPResponseException as exc:  # 4xx: try later; 5xx: refused for good
        return Attempt(False, 400 <= exc.smtp_code < 500, None, f"SMTP {exc.smtp_code}: {exc.smtp_error!r}")
    except smtplib.SMTPRecipientsRefused as exc:
        return Attempt(False, False, None, f"SMTP refused the recipients: {sorted(exc.recipients)}")
    except (smtplib.SMTPException, OSError) as exc:
        return Attempt(False, True, None, f"SMTP error: {type(exc).__name__}: {exc}")


def attempt_delivery(delivery: AlertDelivery) -> Attempt:
    target = delivery.target
    n = notice(delivery.alert, delivery.event, timezone.now())
    timeout = get_settings().ALERTS_DELIVERY_TIMEOUT
    if target.is_email:
        recipients = [r.strip() for r in target.recipients.split(",") if r.strip()]
        if not recipients:
            return Attempt(False, False, None, "the target has no recipients")
        return send_email(recipients, *email_text(n), timeout)
    return post_json(target.url, target.headers or {}, webhook_body(target, n), timeout)
