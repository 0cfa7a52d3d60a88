"""The dashboard's own tables: the audit log of operator actions (dashboard/actions.py
writes it; nothing else does), API tokens and deploy markers."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditOutcome(models.TextChoices):
    #: Done (for a bulk operation: queued; its progress is on the operation).
    OK = "ok", "ok"
    #: The user lacks the operator role; nothing changed.
    DENIED = "denied", "denied"
    #: Bad input (unknown queue, empty selection, wrong confirmation…); nothing changed.
    REJECTED = "rejected", "rejected"
    #: It was allowed and valid but failed (database error, Redis down…).
    ERROR = "error", "error"


class AuditEntry(models.Model):
    """Who did what to which messages, when, and how it went."""

    at = models.DateTimeField(default=timezone.now)
    #: Null once the account is deleted; ``username`` keeps the name.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="sluice_audit_entries")
    username = models.CharField(max_length=150, default="", blank=True)
    #: One of dashboard.actions.ACTIONS ("delete_messages", "purge_queue", "retry_failed", …).
    action = models.CharField(max_length=40)
    #: Which messages: their ids, or the selection in words ("group ValueError @ x.py:f").
    target = models.TextField(default="", blank=True)
    #: The ids acted on (capped), for tools; ``target`` is the readable form.
    target_ids = models.JSONField(default=list, blank=True)
    outcome = models.CharField(max_length=16, choices=AuditOutcome.choices)
    #: The result ("3 deleted") or why it failed.
    detail = models.TextField(default="", blank=True)
    #: "web", "api" or "cli": where the action came from.
    via = models.CharField(max_length=8, default="", blank=True)
    #: The BulkOperation (core.models) a bulk action started.
    operation_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "sluice_audit_entry"
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["-at"], name="sluice_audit_at"),
            models.Index(fields=["username", "-at"], name="sluice_audit_user"),
            models.Index(fields=["action", "-at"], name="sluice_audit_action"),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.username or '?'} {self.action} {self.outcome}"


class ApiToken(models.Model):
    """An API token (``Authorization: Token <key>``), stored as the SHA-256 of its key: the
    key itself is shown once, when ``sluice user token`` issues it, and never again.  Keys
    are 160 random bits, so a plain hash is enough (no password-style slow hash needed).
    dashboard/security/tokens.py issues, checks and revokes them."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sluice_api_tokens")
    digest = models.CharField(max_length=64, unique=True)
    #: The key's first characters, to tell tokens apart in listings and the audit log.
    prefix = models.CharField(max_length=8)
    created = models.DateTimeField(default=timezone.now)
    expires = models.DateTimeField()
    #: Set by ``sluice user token --revoke`` (kept, not deleted: the audit log points at it).
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "sluice_api_token"
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.prefix}… of user {self.user_id}"


class DeployMarker(models.Model):
    """A deploy (``sluice mark-deploy LABEL``): drawn on every chart of the monitoring tab,
    so a change in the figures can be laid beside the release that caused it."""

    #: The database's clock when it was marked (the clock the charts use).
    at = models.DateTimeField()
    label = models.CharField(max_length=200)
    #: Who marked it (the operating-system user of the CLI run, or the dashboard user).
    username = models.CharField(max_length=150, default="", blank=True)

    class Meta:
        db_table = "sluice_deploy_marker"
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["at"], name="sluice_deploy_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.label}"
