"""The OpenAPI description of what the API answers: response shapes (mirroring the
``*_json`` functions of dashboard/api/serializers.py), every status code an operation can
answer, and the ``{"error": ...}`` body of each 4xx/5xx.  tests/test_api_schemathesis.py
holds the live API to it."""
from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers as f

class Error(f.Serializer):
    """What every 4xx/5xx answer holds."""

    error = f.CharField(help_text="What went wrong, for a person to read.")


ERRORS_READ = {
    400: "A query parameter is malformed.",
    401: "No (valid, unexpired, unrevoked) session or token.",
    403: "The account has no Sluice role.",
    404: "Nothing there.",
    429: "Too many requests (DRF throttles); retry later.",
    503: "The database (or Redis) is unavailable.",
}
ERRORS_ACT = {
    **ERRORS_READ,
    400: "Bad input (malformed JSON, unknown queue, empty selection, wrong confirmation…); nothing changed.",
    403: "Only operators may act (the refusal is audited).",
    409: "The message is in the wrong state (held by a receiver, already resolved…).",
    413: "The request body is too large.",
}
ERRORS_ACT_MORE = {**ERRORS_ACT, 501: "The configured store cannot do this."}


def doc(ok: Any, *, code: int = 200, errors: dict[int, str] | None = None, **options: Any):
    """extend_schema with the success answer (``code``: ``ok``) and the error answers.

    The annotation builds on drf-spectacular's AutoSchema named here, not on the project's
    ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``: the API documents itself in any host project."""
    responses: dict[int, Any] = {code: ok}
    for status, text in (errors or ERRORS_READ).items():
        responses[status] = OpenApiResponse(Error, description=text)
    annotate = extend_schema(responses=responses, **options)

    def decorator(method: Any) -> Any:
        if "schema" not in getattr(method, "kwargs", {}):
            method.kwargs = {**getattr(method, "kwargs", {}), "schema": AutoSchema}
        return annotate(method)

    return decorator


def _opt_str(**kw: Any) -> f.CharField:
    return f.CharField(allow_null=True, allow_blank=True, **kw)


class Queue(f.Serializer):
    name = f.CharField()
    kind = f.CharField()
    pending = f.IntegerField(allow_null=True)
    expired = f.IntegerField(allow_null=True)
    delayed_due = f.IntegerField()
    scheduled = f.IntegerField()
    errors = f.IntegerField()
    total = f.IntegerField(allow_null=True)
    estimated = f.BooleanField()
    expired_capped = f.BooleanField()
    errors_estimated = f.BooleanField(help_text="Always false: errors is exact (the database keeps the "
                                      "count). Kept for clients of earlier versions, where it was an estimate "
                                      "above SLUICE_DASHBOARD_EXACT_COUNT_LIMIT.")
    errors_capped = f.BooleanField(help_text="Always false: errors is exact. Kept for clients of earlier "
                                   "versions, where it was a lower bound above SLUICE_DASHBOARD_EXACT_COUNT_LIMIT.")
    oldest_age_seconds = f.FloatField(allow_null=True)
    sent_per_minute = f.FloatField(allow_null=True)
    ttl_seconds = f.FloatField(allow_null=True)
    error = _opt_str()
    paused = f.BooleanField(help_text="No worker receives from the queue until it is resumed.")
    concurrency_limit = f.IntegerField(allow_null=True, help_text="At most this many of its messages handled at once "
                                       "across every worker (null: no limit).")
    rate_limit = f.IntegerField(allow_null=True, help_text="At most this many of its messages taken per second "
                                "across every worker (null: no limit).")


class QueueList(f.Serializer):
    queues = Queue(many=True)
    at = f.DateTimeField()
    problem = _opt_str()


class Message(f.Serializer):
    id = f.CharField()
    row_version = f.IntegerField()
    headers = f.DictField(child=f.CharField(allow_blank=True))
    body = _opt_str(help_text="The body as text (null unless bodies=1, or when it is not UTF-8).")
    body_base64 = _opt_str(help_text="The body, base64 (null unless bodies=1).")
    size = f.IntegerField(help_text="The body's length in bytes.")
    body_included = f.BooleanField()
    expires = f.DateTimeField(allow_null=True)
    expired = f.BooleanField()
    message_type = _opt_str()
    poison = f.BooleanField()
    raw_headers = _opt_str()


class MessageList(f.Serializer):
    messages = Message(many=True)
    next_after = f.IntegerField(allow_null=True, help_text="Pass as ?after= for the next page; null at the end.")


class Delayed(f.Serializer):
    id = f.CharField()
    destination = f.CharField(allow_blank=True)
    due = f.DateTimeField(allow_null=True)
    message_type = _opt_str()
    retry_count = f.IntegerField(allow_null=True)


class DelayedList(f.Serializer):
    delayed = Delayed(many=True)
    now = f.DateTimeField(allow_null=True)


class Failed(f.Serializer):
    id = f.IntegerField()
    message_id = f.CharField(allow_blank=True)
    queue = f.CharField(allow_blank=True)
    message_type = f.CharField(allow_blank=True, allow_null=True)
    exception_type = f.CharField(allow_blank=True)
    exception_message = f.CharField(allow_blank=True)
    group_key = f.CharField(allow_blank=True)
    status = f.CharField()
    time_of_failure = f.DateTimeField(allow_null=True)
    attempts = f.IntegerField(allow_null=True)
    group_title = f.CharField(allow_blank=True, allow_null=True)
    failure_count = f.IntegerField(allow_null=True)
    conversation_id = _opt_str(help_text="Its conversation (/api/conversations/{id}/), when it had one.")


class FailedPage(f.Serializer):
    count = f.IntegerField()
    count_capped = f.BooleanField()
    search_note = _opt_str(help_text="How a short search term was narrowed, when it was.")
    results = Failed(many=True)
    next_cursor = _opt_str(help_text="Pass as ?cursor= for the next page (same filters); null at the end.")


class FailedDetail(Failed):
    stack_trace = f.CharField(allow_blank=True, allow_null=True)
    headers = f.DictField(child=f.CharField(allow_blank=True))
    first_failed_at = f.DateTimeField(allow_null=True)
    last_failed_at = f.DateTimeField(allow_null=True)
    retried_at = f.DateTimeField(allow_null=True)
    resolved_at = f.DateTimeField(allow_null=True)
    archived_at = f.DateTimeField(allow_null=True)
    history = f.ListField(child=f.JSONField())


class Group(f.Serializer):
    key = f.CharField(allow_blank=True)
    title = f.CharField(allow_blank=True)
    count = f.IntegerField()
    first_failed_at = f.DateTimeField(allow_null=True)
    last_failed_at = f.DateTimeField(allow_null=True)
    exception_type = f.CharField(allow_blank=True, allow_null=True)


class GroupList(f.Serializer):
    groups = Group(many=True)


class Operation(f.Serializer):
    id = f.IntegerField()
    kind = f.CharField()
    status = f.CharField()
    total = f.IntegerField(allow_null=True)
    done = f.IntegerField()
    failed = f.IntegerField()
    description = f.CharField(allow_blank=True)
    error = f.CharField(allow_blank=True, allow_null=True)
    requested_by = f.CharField(allow_blank=True)
    progress = f.FloatField()
    created_at = f.DateTimeField(allow_null=True)
    finished_at = f.DateTimeField(allow_null=True)


class OperationList(f.Serializer):
    operations = Operation(many=True)
    next_cursor = _opt_str(help_text="Pass as ?cursor= for the next page; null at the end.")


class OutboxRecord(f.Serializer):
    message_id = f.CharField()
    created_at = f.DateTimeField(allow_null=True)
    quarantined = f.BooleanField()
    last_error = _opt_str()
    size = f.IntegerField()


class OutboxList(f.Serializer):
    records = OutboxRecord(many=True)
    table = f.CharField()
    exists = f.BooleanField()


class Audit(f.Serializer):
    id = f.IntegerField()
    at = f.DateTimeField()
    user = f.CharField(allow_blank=True)
    action = f.CharField()
    target = f.CharField(allow_blank=True)
    outcome = f.CharField()
    detail = f.CharField(allow_blank=True)
    via = f.CharField(allow_blank=True)
    ids = f.ListField(child=f.CharField(allow_blank=True))
    operation = f.IntegerField(allow_null=True)


class AuditPage(f.Serializer):
    entries = Audit(many=True)
    next_cursor = _opt_str(help_text="Pass as ?cursor= for the next page (same filters); null at the end.")


class MetricList(f.Serializer):
    windows = f.ListField(child=f.DictField())
    last_run = f.DictField(allow_null=True)
    next_before = f.DateTimeField(allow_null=True, help_text="Pass as ?before= for older windows; null at the end.")


class ConversationMessage(f.Serializer):
    message_id = f.CharField()
    message_type = f.CharField(allow_blank=True)
    queue = f.CharField(allow_blank=True, help_text="Where it was handled (or failed).")
    endpoint = f.CharField(allow_blank=True, help_text="The endpoint that handled it.")
    intent = f.CharField(allow_blank=True, help_text="send, publish, reply, delayed or retry.")
    related_to = f.CharField(allow_blank=True, help_text="The message whose handler sent this one.")
    parent_on_page = f.BooleanField(help_text="related_to names a message of this page.")
    correlation_id = f.CharField(allow_blank=True)
    originating_endpoint = f.CharField(allow_blank=True)
    originating_host = f.CharField(allow_blank=True)
    worker = f.CharField(allow_blank=True, help_text="The worker (host:pid) of the latest attempt.")
    trace_id = f.CharField(allow_blank=True)
    time_sent = f.DateTimeField(allow_null=True)
    deliver_at = f.DateTimeField(allow_null=True)
    started = f.DateTimeField(allow_null=True)
    ended = f.DateTimeField(allow_null=True)
    delayed_ms = f.FloatField(allow_null=True, help_text="DeliverAt − time sent (a delayed send).")
    wait_ms = f.FloatField(allow_null=True, help_text="Queue wait: (DeliverAt ?? time sent) → started.")
    processing_ms = f.FloatField(allow_null=True)
    clock_skew = f.BooleanField(help_text="A duration is negative: the machines' clocks disagree.")
    outcome = f.CharField(allow_blank=True, help_text="The latest attempt's outcome on this page.")
    attempt = f.IntegerField()
    failed = f.BooleanField()
    failed_id = f.IntegerField(allow_null=True, help_text="The failed-message record (/api/failed/{id}/).")
    failed_status = f.CharField(allow_blank=True)


class Conversation(f.Serializer):
    conversation_id = f.CharField()
    messages = ConversationMessage(many=True, help_text="Oldest first.")
    entries = f.IntegerField(help_text="Attempts and failures this page holds.")
    older = f.IntegerField(help_text="Older entries beyond this page (counted up to older_capped).")
    older_capped = f.BooleanField()
    clock_skew = f.IntegerField(help_text="Messages of this page with a negative duration.")
    next_cursor = _opt_str(help_text="Pass as ?cursor= for the older entries; null at the end.")


class ConversationFound(f.Serializer):
    conversation_id = f.CharField()


class Deleted(f.Serializer):
    deleted = f.IntegerField()


class Moved(f.Serializer):
    moved = f.IntegerField()
    to = f.CharField()


class Delivered(f.Serializer):
    delivered = f.IntegerField()


class Dispatched(f.Serializer):
    dispatched = f.IntegerField()


class SentMessage(f.Serializer):
    message_id = f.CharField()
    queue = f.CharField()
    delayed = f.BooleanField(help_text="True: it waits in the delayed store until its delay has passed.")
    row_version = f.IntegerField(allow_null=True, help_text="Its row in the queue (null when delayed, or "
                                 "already received).")


class PauseState(f.Serializer):
    queue = f.CharField()
    paused = f.BooleanField()
    changed = f.BooleanField(help_text="False: the queue already was in that state.")
    paused_at = f.DateTimeField(allow_null=True)
    paused_by = _opt_str()


class LimitsState(f.Serializer):
    queue = f.CharField()
    concurrency = f.IntegerField(allow_null=True, help_text="Messages handled at once across every worker; null: no limit.")
    rate = f.IntegerField(allow_null=True, help_text="Messages taken per second across every worker; null: no limit.")
    source = f.CharField(allow_blank=True, help_text='"database" (an operator\'s, which win), "settings" '
                         '(SLUICE_QUEUE_LIMITS) or "" (no limits).')
    set_at = f.DateTimeField(allow_null=True)
    set_by = _opt_str()
    changed = f.BooleanField(help_text="False: the limits already were these (always false for a GET).")


class Started(f.Serializer):
    operation = f.IntegerField(allow_null=True, help_text="The bulk operation: poll /api/operations/{id}/.")
    count = f.IntegerField()


class EditedCopy(f.Serializer):
    message_id = f.CharField()


class RunStarted(f.Serializer):
    run = f.IntegerField()


# -- query parameters, with the bounds the views enforce ---------------------------------------------

def limit(default: int, high: int) -> OpenApiParameter:
    return OpenApiParameter("limit", whole(1, high),
                            description=f"Rows per answer (default {default}).")


def whole(low: int, high: int) -> dict[str, Any]:
    """A whole number from ``low`` to ``high``; empty means absent (the default), as for
    every query parameter of this API."""
    return {"anyOf": [{"type": "integer", "minimum": low, "maximum": high}, {"type": "string", "enum": [""]}]}


def choice(name: str, values: Any, empty: bool = True) -> OpenApiParameter:
    """A parameter that takes one of ``values`` (or, when ``empty``, the empty string: the default)."""
    return OpenApiParameter(name, {"type": "string", "enum": [*([""] if empty else []), *values]})


def when(name: str) -> OpenApiParameter:
    """An ISO 8601 time; empty means absent."""
    return OpenApiParameter(name, {"anyOf": [{"type": "string", "format": "date-time"},
                                             {"type": "string", "enum": [""]}]})


def text(name: str) -> OpenApiParameter:
    return OpenApiParameter(name, str)


def search_text(name: str, shortest: int) -> OpenApiParameter:
    """Free text to search for, the spaces around it stripped: nothing left (no search), or
    at least ``shortest`` characters (a shorter term would read every row: refused)."""
    return OpenApiParameter(name, {"type": "string", "pattern": rf"^(\s*|\s*\S[\s\S]{{{shortest - 2},}}\S\s*)$"},
                            description=f"spaces alone, or at least {shortest} characters besides the spaces "
                                        "around them")


CURSOR = OpenApiParameter("cursor", str, description="next_cursor of the previous page; absent for the first.")
