"""What every action returns."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActionResult:
    #: The action's name (dashboard.actions.ACTIONS), as in the audit entry.
    action: str
    #: How many messages / records it acted on (for a bulk operation: how many it will).
    count: int
    #: One line for the user ("3 messages deleted from orders").
    message: str
    #: The AuditEntry written for it.
    audit_id: int | None = None
    #: The BulkOperation started (retry, archive, restore).
    operation_id: int | None = None
    #: The new message's id (edit-and-retry, move).
    message_id: str | None = None
    #: The PipelineRun queued (run_pipeline).
    run_id: int | None = None
    #: The new message's row in its queue (send_message; None when delayed or already received).
    row_version: int | None = None
    #: The new message waits in the delayed store (send_message).
    delayed: bool = False
