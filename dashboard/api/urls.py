"""Routes of the JSON API (``/api/…``, its OpenAPI schema at ``/api/schema/``) and of
``/metrics``; dashboard/urls.py includes them at the root."""
from django.contrib.auth.decorators import login_not_required
from django.urls import path as django_path

from dashboard import metrics
from dashboard.api import errors
from dashboard.api.base import SchemaView
from dashboard.api import alerts as al
from dashboard.api import conversations as conv
from dashboard.api import monitoring as mon
from dashboard.api import failed as fv
from dashboard.api import tasks as tk
from dashboard.api import views as v


def path(route, view, name):
    """The API authenticates itself (session or token; DRF answers 401/403 in JSON), and
    /metrics is open: a login-required middleware must leave both alone."""
    return django_path(route, login_not_required(view), name=name)


urlpatterns = [
    # Like every read: a login (session or token) with a Sluice role.
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("api/queues/", v.QueueList.as_view(), name="api-queues"),
    path("api/queues/<str:name>/messages/", v.QueueMessages.as_view(), name="api-queue-messages"),
    path("api/queues/<str:name>/send/", v.QueueSend.as_view(), name="api-queue-send"),
    # Message ids may hold "/" (order/42): <path:…>, the longer routes first.
    path("api/queues/<str:name>/messages/<path:message_id>/move/", v.QueueMessageMove.as_view(),
         name="api-queue-message-move"),
    path("api/queues/<str:name>/messages/<path:message_id>/", v.QueueMessage.as_view(), name="api-queue-message"),
    path("api/queues/<str:name>/purge/", v.QueuePurge.as_view(), name="api-queue-purge"),
    path("api/queues/<str:name>/pause/", v.QueuePause.as_view(), name="api-queue-pause"),
    path("api/queues/<str:name>/resume/", v.QueueResume.as_view(), name="api-queue-resume"),
    path("api/queues/<str:name>/limits/", v.QueueLimits.as_view(), name="api-queue-limits"),
    path("api/delayed/", v.DelayedList.as_view(), name="api-delayed"),
    path("api/delayed/<path:message_id>/deliver-now/", v.DelayedDeliverNow.as_view(), name="api-delayed-deliver"),
    path("api/delayed/<path:message_id>/", v.DelayedItem.as_view(), name="api-delayed-item"),
    path("api/failed/", fv.FailedList.as_view(), name="api-failed"),
    path("api/failed/groups/", fv.FailedGroups.as_view(), name="api-failed-groups"),
    path("api/failed/retry/", fv.FailedRetry.as_view(), name="api-failed-retry"),
    path("api/failed/archive/", fv.FailedArchive.as_view(), name="api-failed-archive"),
    path("api/failed/restore/", fv.FailedRestore.as_view(), name="api-failed-restore"),
    path("api/failed/delete/", fv.FailedDelete.as_view(), name="api-failed-delete"),
    path("api/failed/<int:pk>/", fv.FailedItem.as_view(), name="api-failed-item"),
    path("api/failed/<int:pk>/edit-retry/", fv.FailedEditRetry.as_view(), name="api-failed-edit-retry"),
    path("api/operations/", fv.OperationList.as_view(), name="api-operations"),
    path("api/operations/<int:pk>/", fv.OperationItem.as_view(), name="api-operation"),
    path("api/conversations/", conv.ConversationSearch.as_view(), name="api-conversations"),
    path("api/conversations/<path:conversation_id>/", conv.ConversationItem.as_view(), name="api-conversation"),
    # A result id is its message's id: <path:…> like message ids.
    path("api/tasks/<path:result_id>/", tk.TaskResultItem.as_view(), name="api-task-result"),
    path("api/outbox/", v.OutboxList.as_view(), name="api-outbox"),
    path("api/outbox/<path:message_id>/dispatch/", v.OutboxDispatch.as_view(), name="api-outbox-dispatch"),
    path("api/audit/", v.AuditList.as_view(), name="api-audit"),
    path("api/metrics/", v.MetricList.as_view(), name="api-metrics"),
    path("api/metrics/run/", v.MetricRun.as_view(), name="api-metrics-run"),
    path("api/monitoring/", mon.MonitoringOverview.as_view(), name="api-monitoring"),
    path("api/monitoring/<str:name>/", mon.MonitoringQueue.as_view(), name="api-monitoring-queue"),
    path("api/alerts/", al.AlertList.as_view(), name="api-alerts"),
    path("api/alerts/rules/", al.RuleList.as_view(), name="api-alert-rules"),
    path("api/alerts/rules/<int:pk>/", al.RuleItem.as_view(), name="api-alert-rule"),
    path("api/alerts/targets/", al.TargetList.as_view(), name="api-alert-targets"),
    path("api/alerts/targets/<int:pk>/", al.TargetItem.as_view(), name="api-alert-target"),
    path("api/alerts/targets/<int:pk>/test/", al.TargetTest.as_view(), name="api-alert-target-test"),
    path("api/alerts/silences/", al.SilenceList.as_view(), name="api-alert-silences"),
    path("api/alerts/silences/<int:pk>/", al.SilenceItem.as_view(), name="api-alert-silence"),
    path("api/alerts/deliveries/", al.DeliveryList.as_view(), name="api-alert-deliveries"),
    path("api/alerts/import/", al.ConfigImport.as_view(), name="api-alert-import"),
    path("api/alerts/export/", al.ConfigExport.as_view(), name="api-alert-export"),
    path("metrics", metrics.metrics, name="metrics"),
    # Last: every other /api/ path answers 404 in JSON (not the HTML page).
    path("api/<path:rest>", errors.not_found, name="api-not-found"),
    path("api/", errors.not_found, name="api-root"),
]
