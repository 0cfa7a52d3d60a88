"""Shapes of the JSON API (README "JSON API"): extend, never rename.

Output is built by the ``*_json`` functions (plain dicts: the shapes are the contract);
the serializers describe request bodies for the OpenAPI schema.  Input is validated by
dashboard.actions, so the pages and the API refuse exactly the same things.
"""
from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from rest_framework import serializers

from core.delayed import DelayedMessage
from core.failures import headers_of
from core.messages import Message
from core.models import BulkOperation, FailedMessage

from dashboard.security.masking import mask_body, mask_headers, mask_raw_headers
from dashboard.models import AuditEntry
from dashboard.counting.stats import QueueStats


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def body_json(body: bytes | memoryview | None) -> dict[str, Any]:
    """``body``: the text when it is UTF-8 (else null); ``body_base64``: always the bytes."""
    data = mask_body(body)  # SLUICE_MASK_BODY_FIELDS: the API shows what the pages show
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"body": text, "body_base64": base64.b64encode(data).decode("ascii")}


def queue_json(q: QueueStats) -> dict[str, Any]:
    return {"name": q.name, "kind": q.kind, "pending": q.pending, "expired": q.expired,
            "delayed_due": q.delayed_due, "scheduled": q.scheduled, "errors": q.errors, "total": q.total,
            "estimated": q.estimated, "expired_capped": q.expired_capped,
            "errors_estimated": q.errors_estimated, "errors_capped": q.errors_capped,
            "oldest_age_seconds": q.oldest_age_seconds, "sent_per_minute": q.sent_per_minute,
            "ttl_seconds": q.ttl_seconds, "error": q.error or None}


def message_json(m: Message, size: int, with_body: bool) -> dict[str, Any]:
    """A queued message; ``body`` / ``body_base64`` are null unless ``with_body`` (a listing
    reads sizes only, ``?bodies=1`` asks for them)."""
    body = body_json(m.body) if with_body else {"body": None, "body_base64": None}
    return {"id": m.id, "row_version": m.row_version, "headers": mask_headers(m.headers), **body, "size": size,
            "body_included": with_body,
            "expires": _iso(m.expires), "expired": m.expired, "message_type": m.message_type,
            "poison": m.poison, "raw_headers": mask_raw_headers(m.raw_headers) if m.poison else None}


def delayed_json(m: DelayedMessage) -> dict[str, Any]:
    return {"id": m.id, "destination": m.destination, "due": _iso(m.due), "message_type": m.message_type,
            "retry_count": m.retry_count}


def failed_json(r: FailedMessage) -> dict[str, Any]:
    return {"id": r.pk, "message_id": r.message_id, "queue": r.original_queue, "message_type": r.message_type,
            "exception_type": r.exception_type, "exception_message": r.exception_message,
            "group_key": r.group_key, "status": r.status, "time_of_failure": _iso(r.time_of_failure),
            "attempts": r.attempts, "group_title": r.group_title, "failure_count": r.failure_count,
            "conversation_id": r.conversation_id or None}


def failed_detail_json(r: FailedMessage) -> dict[str, Any]:
    return {**failed_json(r), "stack_trace": r.stack_trace, "headers": mask_headers(headers_of(r)), **body_json(r.body),
            "first_failed_at": _iso(r.first_failed_at), "last_failed_at": _iso(r.last_failed_at),
            "retried_at": _iso(r.retried_at), "resolved_at": _iso(r.resolved_at),
            "archived_at": _iso(r.archived_at), "history": r.history or []}


def operation_json(op: BulkOperation) -> dict[str, Any]:
    return {"id": op.pk, "kind": op.kind, "status": op.status, "total": op.total, "done": op.done,
            "failed": op.failed, "description": op.description, "error": op.error,
            "requested_by": op.requested_by, "progress": op.progress, "created_at": _iso(op.created_at),
            "finished_at": _iso(op.finished_at)}


def audit_json(e: AuditEntry) -> dict[str, Any]:
    return {"at": _iso(e.at), "user": e.username, "action": e.action, "target": e.target, "outcome": e.outcome,
            "id": e.pk, "detail": e.detail, "via": e.via, "ids": e.target_ids, "operation": e.operation_id}


# -- request bodies (for the OpenAPI schema) ------------------------------------------------------

class PurgeRequest(serializers.Serializer):
    confirm = serializers.CharField(help_text="The queue's name, typed to confirm.")


class SendRequest(serializers.Serializer):
    body = serializers.JSONField(help_text="The body: any JSON value, sent as its JSON text.")
    message_type = serializers.CharField(required=False, allow_blank=True)
    headers = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False,
                                    help_text="Extra headers; Sluice's control headers are refused.")
    delay = serializers.FloatField(required=False, allow_null=True, help_text="Seconds before delivery.")
    ttl = serializers.FloatField(required=False, allow_null=True, help_text="Seconds to live (capped by the "
                                 "queue's TTL).")


class LimitsRequest(serializers.Serializer):
    concurrency = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=10_000,
                                           help_text="Messages handled at once across every worker; null: no "
                                                     "limit; left out: the limit in force is kept.")
    rate = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=10_000,
                                    help_text="Messages taken per second across every worker; null: no limit; "
                                              "left out: the limit in force is kept.")


class MoveRequest(serializers.Serializer):
    to = serializers.CharField(help_text="The queue to move the message to.")


class SelectionRequest(serializers.Serializer):
    ids = serializers.ListField(child=serializers.IntegerField(), required=False,
                                help_text="Failed-message record ids (the `id` of /api/failed/).")
    message_ids = serializers.ListField(child=serializers.CharField(), required=False)
    group = serializers.CharField(required=False, help_text="A group key (/api/failed/groups/).")
    all = serializers.BooleanField(required=False)
    queue = serializers.CharField(required=False, help_text='With "all": only this queue.')
    message_type = serializers.CharField(required=False, help_text='With "all": only this type.')
    older_than_days = serializers.FloatField(required=False, help_text="Archive only: older failures only.")


class EditRetryRequest(serializers.Serializer):
    body = serializers.CharField(allow_blank=True, trim_whitespace=False)
    headers = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
