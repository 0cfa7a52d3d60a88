"""``/tasks/<result id>/``: a Django task's result (core.tasks) — status, times, attempts,
each error with its traceback, the return value — and the way to its message and its
failed-message record.  A task is a message whose id is its result's id, so the message
and failed-message pages link here (:func:`result_link`).

Nothing here imports Django's Tasks framework: the result is read from its table, so the
page works on an install without the framework (and shows results whose task is gone)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from core.conf import get_settings
from core.errors import SluiceError, UnknownQueue
from core.messages import Headers
from core.models import FailedMessage, TaskResultRecord, TaskStatus
from core.queues import queue_model, registry
from core.tasks.names import is_task_message, sluice_queue_of, stored_result
from core.transport import row_id_for
from dashboard.security.masking import mask_value
from dashboard.security.permissions import viewer_required
from dashboard.views.common import body_view, error_response, page

#: The rows at the head of its queue where the page looks for a waiting task's message (the
#: queue table has no index on its Id: a bounded read, as the queue page's filters are).
HEAD_ROWS = 2000
#: A status's tag class (the CSS of the other pages' status tags).
STATUS_TAGS = {TaskStatus.READY: "idle", TaskStatus.RUNNING: "warn", TaskStatus.SUCCESSFUL: "ok",
               TaskStatus.FAILED: "bad"}


@dataclass(frozen=True)
class ResultLink:
    """What a message page shows of its task's result: the page's URL, or None when the
    result's row is gone (pruned after SLUICE_TASK_RESULTS_RETENTION)."""

    url: str | None


def result_link(message_id: str, message_type: str | None) -> ResultLink | None:
    """The result link of a message page: None when the message is no task."""
    if not is_task_message(message_type):
        return None
    exists = stored_result(message_id, get_settings().DATABASE) is not None
    return ResultLink(reverse("dashboard:task-result", args=[message_id]) if exists else None)


def _shown_json(value: Any):
    """A stored JSON value as the page shows it: pretty, escaped by the template, masked like
    message bodies (SLUICE_MASK_BODY_FIELDS: the arguments are the message's body)."""
    try:
        text = json.dumps(mask_value(value), ensure_ascii=False)
    except RecursionError:  # nested deeper than this process's stack allows here
        text = '"(nested too deeply to show)"'
    return body_view(text.encode("utf-8"))


def _message_place(record: TaskResultRecord, using: str) -> dict[str, Any]:
    """Where the task's message is: its page when it waits at the head of its queue, else a
    filtered queue search (a bounded scan) while the task may still wait there."""
    queue = sluice_queue_of(record.backend, record.queue_name)
    try:
        registry.get(queue)
    except (UnknownQueue, ValueError, SluiceError):
        return {"queue": queue, "queue_exists": False}
    place: dict[str, Any] = {"queue": queue, "queue_exists": True}
    if record.status not in (TaskStatus.READY, TaskStatus.RUNNING):
        return place  # received: its message left the queue (a failed one is in the error queue)
    wanted = row_id_for(record.id)
    try:
        head = queue_model(queue, using).objects.using(using).order_by("row_version") \
            .values_list("row_version", "message_id")[:HEAD_ROWS]
        found = next((rv for rv, mid in head if str(mid) == wanted), None)
    except DatabaseError:
        found = None
    if found is not None:
        place["message_url"] = reverse("dashboard:message", args=[queue, found])
    else:
        place["search_url"] = reverse("dashboard:queue", args=[queue]) + "?" + urlencode(
            {"header": Headers.MESSAGE_ID, "value": record.id})
    return place


@viewer_required
@require_GET
def task_result(request: HttpRequest, result_id: str) -> HttpResponse:
    using = get_settings().DATABASE
    record = stored_result(result_id, using)
    if record is None:
        return error_response(request, "There is no task result with this id (never enqueued, or pruned after "
                                       "SLUICE_TASK_RESULTS_RETENTION).", 404)
    failed = FailedMessage.objects.filter(message_id=record.id).order_by("-time_of_failure", "-pk").first()
    # Numbered in the order they happened, shown newest first.
    errors = [{"number": n, "exception_class_path": str(e.get("exception_class_path", "")),
               "traceback": str(e.get("traceback", ""))}
              for n, e in enumerate((e for e in record.errors or [] if isinstance(e, dict)), start=1)]
    args_kwargs = record.args_kwargs if isinstance(record.args_kwargs, dict) else {}
    return page(request, "dashboard/task_result.html", {
        "section": "queues", "record": record, "status_tag": STATUS_TAGS.get(record.status, "dim"),
        "attempts": len(record.worker_ids or []), "worker_ids": list(record.worker_ids or []),
        "errors": list(reversed(errors)), "error_count": len(errors),
        "args": _shown_json(args_kwargs.get("args", [])), "kwargs": _shown_json(args_kwargs.get("kwargs", {})),
        "return_value": _shown_json(record.return_value) if record.status == TaskStatus.SUCCESSFUL else None,
        "failed": failed, **_message_place(record, using),
    })
