"""Sending one notification: the Sluice handler of the alerts queue (``SLUICE_ALERTS_QUEUE``).

Each message names one :class:`AlertDelivery` and the attempt.  The handler makes one
attempt with a timeout (``SLUICE_ALERTS_DELIVERY_TIMEOUT``); on a network error, a
timeout, 408, 429 or 5xx it sends the next attempt to the same queue as a *delayed*
message, ``base × 2^(n-1)`` seconds later with full jitter, or after the target's
``Retry-After`` — both capped at ``SLUICE_ALERTS_RETRY_CAP`` — so a slow or dead target
never holds a pump thread between attempts.  Other answers, or the last attempt, fail the
delivery for good: the alerts page shows it and a ``delivery_failed`` rule alerts on it.

Nothing here logs or stores a target's URL, headers or routing key: errors pass through
:func:`redact` first.
"""
from __future__ import annotations

import email.utils
import json
import logging
import random
import smtplib
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from django.core.mail import EmailMessage, get_connection
from django.utils import timezone

from core.alerts.models import AlertDelivery, AlertTarget, DeliveryStatus
from core.alerts.payloads import email_text, notice, webhook_body
from core.conf import get_settings
from core.handlers import HandlerContext, handlers
from core.messages import Message

log = logging.getLogger("sluice.alerts")

#: Answers are read up to this many bytes (kept in the delivery's error).
SNIPPET = 300
DONE = (DeliveryStatus.SENT, DeliveryStatus.FAILED, DeliveryStatus.RATE_LIMITED)


@dataclass(frozen=True)
class Attempt:
    ok: bool
    retryable: bool = False
    retry_after: float | None = None
    error: str = ""


def redact(text: str, target: AlertTarget) -> str:
    for secret in target.secrets():
        text = text.replace(secret, "[secret]")
    return text


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
        snippet = exc.read(SNIPPET).decode("utf-8", "replace") if exc.fp else ""
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


def deliver(message: Message, context: HandlerContext) -> None:
    """The alerts queue's handler (see the module doc)."""
    body = message.json() or {}
    delivery = (AlertDelivery.objects.select_related("target", "alert", "alert__rule")
                .filter(pk=body.get("delivery")).first())
    if delivery is None or delivery.status in DONE:
        return  # deleted meanwhile, or a duplicate of a finished one
    attempt = int(body.get("attempt", 1))
    result = attempt_delivery(delivery)
    delivery.attempts = attempt
    delivery.last_error = redact(result.error, delivery.target)[:1000]
    name = f"{delivery.event} notification #{delivery.pk} to {delivery.target.name}"
    if result.ok:
        delivery.status, delivery.finished_at = DeliveryStatus.SENT, timezone.now()
        log.info("%s sent (attempt %d)", name, attempt)
    elif result.retryable and attempt < get_settings().ALERTS_DELIVERY_ATTEMPTS:
        wait = backoff(attempt, result.retry_after)
        delivery.status = DeliveryStatus.RETRYING
        context.send(get_settings().ALERTS_QUEUE, {"delivery": delivery.pk, "attempt": attempt + 1},
                     message_type="Sluice.AlertDelivery", delay=wait)
        log.warning("%s: attempt %d failed (%s); next in %.1f s", name, attempt, delivery.last_error, wait)
    else:
        delivery.status, delivery.finished_at = DeliveryStatus.FAILED, timezone.now()
        log.error("%s failed for good after %d attempt(s): %s", name, attempt, delivery.last_error)
    delivery.save(update_fields=["attempts", "last_error", "status", "finished_at"])


def register() -> None:
    """Serve the alerts queue in this process (idempotent)."""
    handlers.register(get_settings().ALERTS_QUEUE, None, deliver)
