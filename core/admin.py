"""Sluice's tables in the Django admin, read-only: changing them by hand would bypass the
engine (queue tables need DDL, failed messages and operations have their own code paths,
the delayed store and the outbox are the workers')."""
from __future__ import annotations

from django.contrib import admin

from core.demo.models import PingRecord
from core.models import BulkOperation, DelayedMessageRow, FailedMessage, Lease, OutboxRecord, QueueRecord


class ReadOnlyAdmin(admin.ModelAdmin):
    """Look, search and filter; no add, change or delete."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(QueueRecord)
class QueueRecordAdmin(ReadOnlyAdmin):
    list_display = ("name", "kind", "default_ttl_seconds", "dead_letter_on_expiry", "auto_delete_on_idle_seconds",
                    "last_activity", "created_at")
    list_filter = ("kind",)
    search_fields = ("name",)


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ("name", "holder", "expires_at")


@admin.register(FailedMessage)
class FailedMessageAdmin(ReadOnlyAdmin):
    list_display = ("message_id", "original_queue", "message_type", "exception_type", "status", "time_of_failure",
                    "failure_count")
    list_filter = ("status", "original_queue")
    search_fields = ("message_id",)
    date_hierarchy = "time_of_failure"
    show_full_result_count = False  # no COUNT(*) of a big table per page


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "description", "status", "total", "done", "failed", "requested_by", "created_at")
    list_filter = ("kind", "status")


@admin.register(DelayedMessageRow)
class DelayedMessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "destination", "time", "retry_count")
    search_fields = ("id", "destination")
    show_full_result_count = False


@admin.register(OutboxRecord)
class OutboxRecordAdmin(ReadOnlyAdmin):
    list_display = ("message_id", "dispatched", "created_at", "dispatched_at", "quarantined")
    list_filter = ("dispatched", "quarantined")
    search_fields = ("message_id",)
    show_full_result_count = False


@admin.register(PingRecord)
class PingRecordAdmin(ReadOnlyAdmin):
    list_display = ("message_id", "handled_at")
    search_fields = ("message_id",)
