from django.urls import include, path

from dashboard.views import charts
from dashboard.views import alerts, audit, auth, conversations, delayed, failed, health, monitoring, outbox, overview, queues

app_name = "dashboard"
urlpatterns = [
    path("", include("dashboard.api.urls")),  # the JSON API (/api/…) and /metrics
    path("healthz", health.healthz, name="healthz"),
    path("accounts/login/", auth.login, name="login"),
    path("accounts/logout/", auth.logout, name="logout"),
    path("", overview.overview, name="overview"),
    path("partials/overview/", overview.overview_numbers, name="overview-numbers"),
    path("queues/<str:name>/", queues.queue, name="queue"),
    path("queues/<str:name>/messages/<int:row_version>/", queues.message, name="message"),
    path("queues/<str:name>/messages/<int:row_version>/body", queues.message_body, name="message-body"),
    path("queues/<str:name>/delete/", queues.delete, name="queue-delete"),
    path("queues/<str:name>/purge/", queues.purge, name="queue-purge"),
    path("queues/<str:name>/move/", queues.move, name="queue-move"),
    path("delayed/", delayed.delayed, name="delayed"),
    # Message ids may hold "/" (order/42): <path:…>.
    path("delayed/<path:message_id>/deliver-now/", delayed.deliver_now, name="delayed-deliver-now"),
    path("delayed/<path:message_id>/delete/", delayed.delete, name="delayed-delete"),
    path("failed/", failed.failed_list, name="failed"),
    path("failed/operations/", failed.operations, name="failed-operations"),
    path("failed/retry/", failed.retry, name="failed-retry"),
    path("failed/archive/", failed.archive, name="failed-archive"),
    path("failed/restore/", failed.restore, name="failed-restore"),
    path("failed/delete/", failed.delete, name="failed-delete"),
    path("failed/<int:pk>/", failed.failed_detail, name="failed-detail"),
    path("failed/<int:pk>/body", failed.failed_body, name="failed-body"),
    path("failed/<int:pk>/edit/", failed.edit_retry, name="failed-edit"),
    path("conversations/", conversations.search, name="conversations"),
    # Conversation ids may hold "/" like message ids: <path:…>.
    path("conversations/<path:conversation_id>/", conversations.conversation, name="conversation"),
    path("outbox/", outbox.outbox, name="outbox"),
    path("outbox/<path:message_id>/dispatch/", outbox.dispatch, name="outbox-dispatch"),
    path("audit/", audit.audit, name="audit"),
    path("alerts/", alerts.alerts, name="alerts"),
    path("alerts/rules/", alerts.rule_save, name="alerts-rule-save"),
    path("alerts/rules/<int:pk>/delete/", alerts.rule_delete, name="alerts-rule-delete"),
    path("alerts/targets/", alerts.target_save, name="alerts-target-save"),
    path("alerts/targets/<int:pk>/delete/", alerts.target_delete, name="alerts-target-delete"),
    path("alerts/targets/<int:pk>/test/", alerts.target_test, name="alerts-target-test"),
    path("alerts/silences/", alerts.silence_create, name="alerts-silence"),
    path("alerts/silences/<int:pk>/end/", alerts.silence_expire, name="alerts-silence-expire"),
    path("alerts/import/", alerts.import_config, name="alerts-import"),
    path("monitoring/", monitoring.monitoring, name="monitoring"),
    path("monitoring/<str:name>/", monitoring.monitoring_queue, name="monitoring-queue"),
    path("metrics/charts/", charts.charts, name="metrics-charts"),
    path("metrics/charts/run/", charts.run_now, name="metrics-run"),
    path("metrics/charts/run-status/", charts.run_status, name="metrics-run-status"),
]
