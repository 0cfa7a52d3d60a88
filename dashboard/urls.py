import re

from django.urls import include, path, register_converter

from dashboard.views import charts
from dashboard.views import (
    alerts, assets, audit, auth, conversations, delayed, failed, health, monitoring, outbox, overview, queues,
    sending, tasks,
)



class IdConverter:
    """An id from message data (message, outbox record, conversation) as one path segment.

    A browser resolves ``/delayed/../alerts/rules/1/delete/`` to ``/alerts/rules/1/delete/``
    (``%2e%2e`` too), and reverse() leaves "/" and "." as they are: so "/" and an all-dots id
    are written ``~2F`` / ``~2E`` (and "~" itself ``~7E``), which no browser moves and which
    to_python reads back.  A raw "/" still matches (order/42 posted by hand or by a client)."""

    regex = ".+"
    _escaped = re.compile("~(7E|2F|2E)")

    def to_python(self, value: str) -> str:
        return self._escaped.sub(lambda m: chr(int(m.group(1), 16)), value)

    def to_url(self, value: str) -> str:
        value = str(value).replace("~", "~7E").replace("/", "~2F")
        return value.replace(".", "~2E") if value in (".", "..") else value


class QueueNameConverter(IdConverter):
    """A queue name (no "/"; a valid one has no "~" and starts with no dot, so its URL is
    itself): escaped like an id so that a name taken from message data (a delayed message's
    destination) cannot leave its route either."""

    regex = "[^/]+"


register_converter(IdConverter, "sluice_id")  # prefixed: the registry is global to the host project
register_converter(QueueNameConverter, "sluice_queue")

app_name = "dashboard"
urlpatterns = [
    path("", include("dashboard.api.urls")),  # the JSON API (/api/…) and /metrics
    path("healthz", health.healthz, name="healthz"),
    path("favicon.ico", assets.favicon, name="favicon"),
    path("accounts/login/", auth.login, name="login"),
    path("accounts/logout/", auth.logout, name="logout"),
    path("accounts/sso/login/", auth.sso_login, name="oidc-login"),
    path("accounts/sso/callback/", auth.sso_callback, name="oidc-callback"),
    path("", overview.overview, name="overview"),
    path("partials/overview/", overview.overview_numbers, name="overview-numbers"),
    path("queues/<sluice_queue:name>/", queues.queue, name="queue"),
    path("queues/<sluice_queue:name>/messages/<int:row_version>/", queues.message, name="message"),
    path("queues/<sluice_queue:name>/messages/<int:row_version>/body", queues.message_body, name="message-body"),
    path("queues/<sluice_queue:name>/delete/", queues.delete, name="queue-delete"),
    path("queues/<sluice_queue:name>/purge/", queues.purge, name="queue-purge"),
    path("queues/<sluice_queue:name>/move/", queues.move, name="queue-move"),
    path("send/", sending.send, name="send"),
    path("queues/<sluice_queue:name>/pause/", queues.pause, name="queue-pause"),
    path("queues/<sluice_queue:name>/resume/", queues.resume, name="queue-resume"),
    path("queues/<sluice_queue:name>/limit/", queues.limit, name="queue-limit"),
    path("delayed/", delayed.delayed, name="delayed"),
    # Message ids may hold "/" (order/42): <sluice_id:…> (IdConverter).
    path("delayed/<sluice_id:message_id>/deliver-now/", delayed.deliver_now, name="delayed-deliver-now"),
    path("delayed/<sluice_id:message_id>/delete/", delayed.delete, name="delayed-delete"),
    path("failed/", failed.failed_list, name="failed"),
    path("failed/operations/", failed.operations, name="failed-operations"),
    path("failed/retry/", failed.retry, name="failed-retry"),
    path("failed/archive/", failed.archive, name="failed-archive"),
    path("failed/restore/", failed.restore, name="failed-restore"),
    path("failed/delete/", failed.delete, name="failed-delete"),
    path("failed/<int:pk>/", failed.failed_detail, name="failed-detail"),
    path("failed/<int:pk>/body", failed.failed_body, name="failed-body"),
    path("failed/<int:pk>/edit/", failed.edit_retry, name="failed-edit"),
    # A Django task's result (its id is its message's: <sluice_id:…> like message ids).
    path("tasks/<sluice_id:result_id>/", tasks.task_result, name="task-result"),
    path("conversations/", conversations.search, name="conversations"),
    # Conversation ids may hold "/" like message ids: <sluice_id:…>.
    path("conversations/<sluice_id:conversation_id>/", conversations.conversation, name="conversation"),
    path("outbox/", outbox.outbox, name="outbox"),
    path("outbox/<sluice_id:message_id>/dispatch/", outbox.dispatch, name="outbox-dispatch"),
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
    path("monitoring/<sluice_queue:name>/", monitoring.monitoring_queue, name="monitoring-queue"),
    path("metrics/charts/", charts.charts, name="metrics-charts"),
    path("metrics/charts/run/", charts.run_now, name="metrics-run"),
    path("metrics/charts/run-status/", charts.run_status, name="metrics-run-status"),
]
