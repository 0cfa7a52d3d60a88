"""The audit trail in the Django admin, read-only (only dashboard.actions writes it)."""
from __future__ import annotations

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from dashboard.models import ApiToken, AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "username", "action", "target", "outcome", "via")
    list_filter = ("action", "outcome", "via")
    search_fields = ("username", "target")
    date_hierarchy = "at"


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Which tokens exist and whose they are; never the digest (keys are shown only once,
    by ``sluice user token``)."""

    list_display = ("prefix", "user", "created", "expires", "revoked_at")
    fields = list_display
    list_filter = ("revoked_at",)
    search_fields = ("user__username", "prefix")
