"""``/api/tasks/<result id>/``: a Django task's result (core.tasks) as the dashboard's result
page shows it — status, times, attempts, errors with tracebacks, return value, arguments —
read from its table, without Django's Tasks framework."""
from __future__ import annotations

from typing import Any

from rest_framework import serializers as f
from rest_framework.request import Request
from rest_framework.response import Response

from core.conf import get_settings
from core.models import FailedMessage, TaskResultRecord, TaskStatus
from core.tasks.names import sluice_queue_of, stored_result
from dashboard.actions import ActionError
from dashboard.api.base import SluiceAPIView
from dashboard.api.schema import doc
from dashboard.security.masking import mask_value


class TaskError(f.Serializer):
    exception_class_path = f.CharField(allow_blank=True, help_text="The exception's class, as module.QualName.")
    traceback = f.CharField(allow_blank=True)


class TaskResultShape(f.Serializer):
    id = f.CharField(help_text="The result id, also the task message's id.")
    task_path = f.CharField()
    backend = f.CharField(help_text="The alias of the backend in TASKS.")
    queue_name = f.CharField(help_text="The task's queue name.")
    queue = f.CharField(help_text="The Sluice queue it maps to (QUEUE_PREFIX before the name).")
    status = f.ChoiceField(choices=TaskStatus.values)
    enqueued_at = f.DateTimeField(allow_null=True)
    run_after = f.DateTimeField(allow_null=True)
    started_at = f.DateTimeField(allow_null=True)
    last_attempted_at = f.DateTimeField(allow_null=True)
    finished_at = f.DateTimeField(allow_null=True)
    attempts = f.IntegerField(help_text="How many times it ran (one worker id each).")
    worker_ids = f.ListField(child=f.CharField(allow_blank=True))
    errors = TaskError(many=True, help_text="One per failed attempt, oldest first.")
    return_value = f.JSONField(allow_null=True, help_text="The JSON return value; null unless SUCCESSFUL.")
    args = f.JSONField(help_text="The positional arguments (a list).")
    kwargs = f.JSONField(help_text="The keyword arguments (an object).")
    failed_id = f.IntegerField(allow_null=True, help_text="Its failed message (/api/failed/{id}/), newest first, "
                               "once it reached the error queue.")


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def task_result_json(r: TaskResultRecord, failed_id: int | None) -> dict[str, Any]:
    """A result as the API answers it (masked like message bodies: SLUICE_MASK_BODY_FIELDS)."""
    args_kwargs = r.args_kwargs if isinstance(r.args_kwargs, dict) else {}
    errors = [{"exception_class_path": str(e.get("exception_class_path", "")), "traceback": str(e.get("traceback", ""))}
              for e in r.errors or [] if isinstance(e, dict)]
    return {"id": r.id, "task_path": r.task_path, "backend": r.backend, "queue_name": r.queue_name,
            "queue": sluice_queue_of(r.backend, r.queue_name), "status": r.status,
            "enqueued_at": _iso(r.enqueued_at), "run_after": _iso(r.run_after), "started_at": _iso(r.started_at),
            "last_attempted_at": _iso(r.last_attempted_at), "finished_at": _iso(r.finished_at),
            "attempts": len(r.worker_ids or []), "worker_ids": [str(w) for w in r.worker_ids or []], "errors": errors,
            "return_value": mask_value(r.return_value) if r.status == TaskStatus.SUCCESSFUL else None,
            "args": mask_value(args_kwargs.get("args", [])), "kwargs": mask_value(args_kwargs.get("kwargs", {})),
            "failed_id": failed_id}


class TaskResultItem(SluiceAPIView):
    @doc(TaskResultShape, summary="A Django task's result: status, times, attempts, errors and return value",
         operation_id="task_result")
    def get(self, request: Request, result_id: str) -> Response:
        record = stored_result(result_id, get_settings().DATABASE)
        if record is None:
            raise ActionError("no task result has this id (never enqueued, or pruned)", 404)
        failed_id = FailedMessage.objects.filter(message_id=record.id).order_by("-time_of_failure", "-pk") \
            .values_list("pk", flat=True).first()
        return Response(task_result_json(record, failed_id))
