"""The audit trail in the Django admin, read-only (only dashboard.actions writes it)."""
from __future__ import annotations

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from dashboard.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "username", "action", "target", "outcome", "via")
    list_filter = ("action", "outcome", "via")
    search_fields = ("username", "target")
    date_hierarchy = "at"
