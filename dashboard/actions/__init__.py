"""THE code path of every operator action, shared by the pages and the JSON API.

Each action takes the acting user first, checks :func:`dashboard.security.permissions.can_act`
(``PermissionDenied`` otherwise), validates its input (:class:`ActionError`: a message for
the user and an HTTP status), acts through ``core`` (or starts a ``BulkOperation`` that a
Celery worker runs), writes one :class:`~dashboard.models.AuditEntry` with the outcome,
and returns an :class:`ActionResult`.  ``via`` ("web", "api") is recorded too.

Queues:   delete_messages, purge_queue, move_message, pause_queue, resume_queue, limit_queue,
          clear_queue_limits
Sending:  send_message (the dashboard's send form)
Delayed:  deliver_delayed_now, delete_delayed
Failed:   retry_failed, archive_failed, restore_failed, edit_and_retry, delete_failed
          (selections: see :func:`parse_selection`)
Outbox:   dispatch_outbox
Metrics:  run_pipeline (the analytics pipeline, as a Celery task)
Alerts:   save_alert_rule, delete_alert_rule, save_alert_target, delete_alert_target,
          test_alert_target, create_silence, expire_silence, import_alerts
"""
from dashboard.actions.alerts import (
    create_silence,
    delete_alert_rule,
    delete_alert_target,
    expire_silence,
    import_alerts,
    save_alert_rule,
    save_alert_target,
    test_alert_target,
)
from dashboard.actions.delayed import delete_delayed, deliver_delayed_now, dispatch_outbox
from dashboard.actions.errors import ActionError
from dashboard.actions.failed import (
    PROTECTED_HEADERS,
    FailedSelection,
    archive_failed,
    delete_failed,
    edit_and_retry,
    parse_selection,
    restore_failed,
    retry_failed,
)
from dashboard.actions.pipeline import run_pipeline
from dashboard.actions.queues import (clear_queue_limits, delete_messages, limit_queue, move_message, pause_queue,
                                      purge_queue, resume_queue)
from dashboard.actions.result import ActionResult
from dashboard.actions.sending import send_message

#: Every action name, as AuditEntry.action stores it (filters on the audit page).
ACTIONS = (
    "delete_messages", "purge_queue", "move_message", "deliver_delayed_now", "delete_delayed",
    "retry_failed", "archive_failed", "restore_failed", "edit_and_retry", "delete_failed", "dispatch_outbox",
    "run_pipeline", "save_alert_rule", "delete_alert_rule", "save_alert_target", "delete_alert_target",
    "test_alert_target", "create_silence", "expire_silence", "import_alerts", "pause_queue", "resume_queue",
    "send_message", "limit_queue",
)
#: Account changes (`sluice user`, via "cli"), audited beside the actions.
ACCOUNT_ACTIONS = ("set_role", "issue_token", "revoke_token", "disable_user")
#: Every name an AuditEntry.action can hold.
#: Records of what happened outside Sluice (`sluice mark-deploy`, via "cli").
MARK_ACTIONS = ("mark_deploy",)
AUDITED = ACTIONS + ACCOUNT_ACTIONS + MARK_ACTIONS

__all__ = [
    "ACCOUNT_ACTIONS", "ACTIONS", "AUDITED", "MARK_ACTIONS", "ActionError", "ActionResult", "FailedSelection", "PROTECTED_HEADERS", "archive_failed",
    "delete_delayed", "delete_failed", "delete_messages", "deliver_delayed_now", "dispatch_outbox",
    "edit_and_retry", "move_message", "parse_selection", "purge_queue", "restore_failed", "retry_failed",
    "run_pipeline", "save_alert_rule", "delete_alert_rule", "save_alert_target", "delete_alert_target",
    "test_alert_target", "create_silence", "expire_silence", "import_alerts", "pause_queue", "resume_queue",
    "send_message", "limit_queue", "clear_queue_limits",
]
