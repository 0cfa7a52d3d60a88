"""Alerting tables: rules, targets, silences (operators edit them), the alerts the
evaluator raises and the deliveries of their notifications.

A rule is evaluated for every scope it matches (a queue, a worker, a breaker, a failed
group…); each breaching scope is one :class:`Alert` row whose ``fingerprint`` (the de-dup
key: a hash of the rule and its labels) stays the same from firing to resolved.
"""
from __future__ import annotations

from django.db import models


class RuleKind(models.TextChoices):
    FAILED_GROUP = "failed_group", "failed-message group appears or grows by N in T"
    BREAKER_OPEN = "breaker_open", "circuit breaker open"
    HEARTBEAT_LOST = "heartbeat_lost", "worker heartbeat stopped"
    QUEUE_LENGTH = "queue_length", "queue length above N"
    OLDEST_AGE = "oldest_age", "oldest message older than T seconds"
    CRITICAL_TIME = "critical_time", "critical time (sent to handled) p95 above T seconds"
    STALLED_QUEUE = "stalled_queue", "messages waiting, no completions for T"
    OUTBOX_BACKLOG = "outbox_backlog", "outbox backlog above N"
    OUTBOX_AGE = "outbox_age", "oldest undispatched outbox record older than T seconds"
    DELAYED_NOT_MOVED = "delayed_not_moved", "delayed messages due but not moved for T seconds"
    REDIS_DOWN = "redis_down", "Redis unreachable from the evaluating worker"
    DATABASE_DOWN = "database_down", "the database unreachable from a worker (its database breakers)"
    WORKERS_BELOW = "workers_below", "fewer than N live workers (none at all included)"
    RECORDS_NOT_EXPORTED = "records_not_exported", "processing records not exported for T seconds"
    DELIVERY_FAILED = "delivery_failed", "an alert notification finally failed"
    QUEUE_PAUSED = "queue_paused", "a queue paused for longer than T seconds"


class Severity(models.TextChoices):
    CRITICAL = "critical", "critical"
    ERROR = "error", "error"
    WARNING = "warning", "warning"
    INFO = "info", "info"


class TargetFormat(models.TextChoices):
    EMAIL = "email", "email (Django's email backend)"
    ALERTMANAGER = "alertmanager", "webhook: Prometheus Alertmanager v2"
    SLACK = "slack", "webhook: Slack incoming webhook"
    TEAMS = "teams", "webhook: Microsoft Teams"
    PAGERDUTY = "pagerduty", "webhook: PagerDuty Events v2"


class AlertTarget(models.Model):
    """Where notifications go.  ``url``, ``headers`` and ``routing_key`` are secrets: pages,
    the API and logs show :attr:`display_address` only."""

    name = models.CharField(max_length=100, unique=True)
    format = models.CharField(max_length=16, choices=TargetFormat.choices, default=TargetFormat.ALERTMANAGER)
    url = models.CharField(max_length=2000, default="", blank=True)
    headers = models.JSONField(default=dict, blank=True)
    routing_key = models.CharField(max_length=200, default="", blank=True)
    #: Email recipients, comma-separated.
    recipients = models.CharField(max_length=2000, default="", blank=True)
    #: Most notifications per hour to this target (0: no limit); more are recorded as rate-limited.
    max_per_hour = models.IntegerField(default=60)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "sluice_alert_target"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.format})"

    @property
    def is_email(self) -> bool:
        return self.format == TargetFormat.EMAIL

    @property
    def display_address(self) -> str:
        """What may be shown: recipients, or the URL's scheme and host only."""
        if self.is_email:
            return self.recipients
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(self.url)
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # a row stored before every part was checked (port 99999): shown, not raised
            return "(invalid url)"
        return f"{parts.scheme}://{parts.hostname or '?'}{port}/…"

    def secrets(self) -> list[str]:
        """Texts that must never reach a log line or a page, longest first: the URL and every
        part of it past the host (a webhook's path or query is often its secret, and a target
        may echo either, whole or in part, or percent-decoded), the routing key, the headers."""
        from urllib.parse import parse_qsl, unquote, urlsplit

        try:
            parts = urlsplit(self.url or "")
        except ValueError:  # a bad stored row: its whole URL is still a secret
            parts = urlsplit("")
        values = [self.url, self.routing_key, *[str(v) for v in (self.headers or {}).values()],
                  parts.username or "", parts.password or "", parts.path if parts.path != "/" else "",
                  parts.query, parts.fragment, *parts.path.split("/"),
                  *[v for pair in parse_qsl(parts.query, keep_blank_values=True) for v in pair]]
        values += [unquote(v) for v in values]
        return sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)


class AlertRule(models.Model):
    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=32, choices=RuleKind.choices)
    #: N (a count) or T (seconds), as the kind says.
    threshold = models.FloatField(default=0)
    #: The T of "grows by N in T" / "no completions for T" (seconds).
    window_seconds = models.FloatField(default=300)
    #: The condition must hold this long before the alert fires.
    for_seconds = models.FloatField(default=0)
    #: Consecutive clear evaluations before a firing alert resolves.
    clear_after = models.IntegerField(default=3)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    #: Which scopes: {"queue": "orders*", "worker": …, "breaker": …, "message_type": …,
    #: "exception_type": …, "header": {"name": "value"}} (``*`` matches any text).
    filters = models.JSONField(default=dict, blank=True)
    #: Targets to notify; none selected: every enabled target.
    targets = models.ManyToManyField(AlertTarget, blank=True, related_name="rules")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "sluice_alert_rule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Silence(models.Model):
    """Mutes notifications of matching alerts between ``starts_at`` and ``ends_at``: one rule
    (or every rule), optionally only alerts whose labels include ``matchers``.  A silence set
    up ahead of time for every rule is a maintenance window."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="silences")
    matchers = models.JSONField(default=dict, blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    comment = models.CharField(max_length=500, default="", blank=True)
    created_by = models.CharField(max_length=150, default="", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "sluice_alert_silence"
        ordering = ["-ends_at", "-id"]
        indexes = [models.Index(fields=["ends_at"], name="sluice_silence_ends")]

    def matches(self, rule_id: int, labels: dict[str, str], at) -> bool:
        if not self.starts_at <= at < self.ends_at:
            return False
        if self.rule_id is not None and self.rule_id != rule_id:
            return False
        return all(labels.get(k) == str(v) for k, v in (self.matchers or {}).items())


class AlertState(models.TextChoices):
    PENDING = "pending", "pending (waiting out the for-duration)"
    FIRING = "firing", "firing"
    RESOLVED = "resolved", "resolved"


class Alert(models.Model):
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    #: The de-dup key: the first 32 hex digits of SHA-256 over the sorted label lines.
    fingerprint = models.CharField(max_length=32)
    labels = models.JSONField(default=dict)
    summary = models.CharField(max_length=500, default="")
    state = models.CharField(max_length=16, choices=AlertState.choices, default=AlertState.PENDING)
    value = models.FloatField(null=True)
    #: When the condition was first seen (the for-duration counts from here).
    started_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True)
    resolved_at = models.DateTimeField(null=True)
    evaluated_at = models.DateTimeField()
    #: Consecutive clear evaluations so far (resolves at the rule's clear_after).
    clear_count = models.IntegerField(default=0)
    #: The firing notification went out (not while silenced): only then is a resolution sent.
    notified = models.BooleanField(default=False)

    class Meta:
        db_table = "sluice_alert"
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["state", "rule"], name="sluice_alert_state"),
            models.Index(fields=["fingerprint", "state"], name="sluice_alert_fp"),
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} {self.labels} {self.state}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    #: An attempt is under way (committed before the call; ``sending_until`` is its deadline).
    SENDING = "sending", "sending"
    RETRYING = "retrying", "retrying"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"
    RATE_LIMITED = "rate_limited", "rate-limited (not sent)"


class AlertDelivery(models.Model):
    """One notification to one target: the message on the alerts queue that carries it."""

    alert = models.ForeignKey(Alert, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    target = models.ForeignKey(AlertTarget, on_delete=models.CASCADE, related_name="deliveries")
    #: "firing", "resolved" or "test".
    event = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.IntegerField(default=0)
    #: The deadline of the attempt under way (status ``sending``): past it with no result,
    #: the attempt counts as lost (its worker stopped) and the next one is sent.
    sending_until = models.DateTimeField(null=True, blank=True)
    #: Why the last attempt failed (secrets removed).
    last_error = models.CharField(max_length=1000, default="", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "sluice_alert_delivery"
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["target", "created_at"], name="sluice_delivery_target"),
            models.Index(fields=["status", "finished_at"], name="sluice_delivery_status"),
        ]


class WorkerSighting(models.Model):
    """The last time the evaluator saw each worker's heartbeat: how a stopped worker is noticed
    once its heartbeat key has expired."""

    name = models.CharField(max_length=255, primary_key=True)
    last_seen = models.DateTimeField()

    class Meta:
        db_table = "sluice_alert_worker_seen"
