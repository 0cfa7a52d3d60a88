"""The audit log's entries (dashboard.models.AuditEntry), and the engine's signals that
write them for the command line.  The dashboard's actions write theirs through
dashboard.actions.audit.acting; this module imports no action and no web framework, so
every process (a worker too) can load the receivers the app connects at start-up."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

from core.runtime import limits
from dashboard.models import AuditEntry, AuditOutcome

log = logging.getLogger("sluice.audit")

#: Ids kept per entry (the target text says how many more there were).
MAX_TARGET_IDS = 200


@dataclass
class Audit:
    """Filled in by the action while it runs; written when it ends."""

    user: Any
    action: str
    via: str
    target: str = ""
    ids: list[str] = field(default_factory=list)
    detail: str = ""
    operation_id: int | None = None
    entry_id: int | None = None
    #: Who acted when that is no dashboard user (the operating-system user of a CLI run).
    actor: str = ""

    def write(self, outcome: str, detail: str | None = None) -> None:
        user = self.user if getattr(self.user, "is_authenticated", False) else None
        try:
            entry = AuditEntry.objects.create(
                user=user, username=getattr(user, "username", "") if user else self.actor[:150], action=self.action,
                target=self.target[:4000], target_ids=[str(i) for i in self.ids[:MAX_TARGET_IDS]],
                outcome=outcome, detail=(self.detail if detail is None else detail)[:4000], via=self.via[:8],
                operation_id=self.operation_id)
            self.entry_id = entry.pk
        except DatabaseError as exc:  # the database is down: the action's own error says so
            log.error("could not write the audit entry for %s by %s (%s): %s", self.action,
                      getattr(user, "username", "?"), outcome, exc)


def audit_cli_pause(sender: Any, *, queue: str, paused: bool, by: str, via: str, **_: Any) -> None:
    """core.runtime.pauses.pause_changed: the command line's pauses and resumes go into the audit log
    (the dashboard's own actions write theirs in :func:`acting`)."""
    if via == "cli":
        Audit(user=None, action="pause_queue" if paused else "resume_queue", via="cli",
              target=f"queue {queue}", actor=by).write(AuditOutcome.OK, "paused" if paused else "resumed")


def describe_limits(found: limits.Limits) -> str:
    parts = [f"at most {found.concurrency} at once" if found.concurrency else "",
             f"at most {found.rate} per second" if found.rate else ""]
    text = ", ".join(p for p in parts if p) or "no limits"
    return text + {"settings": " (SLUICE_QUEUE_LIMITS)", "database": " (set by an operator)"}.get(found.source, "")


def audit_cli_limits(sender: Any, *, queue: str, concurrency: int | None, rate: int | None, cleared: bool,
                     by: str, via: str, **_: Any) -> None:
    """core.runtime.limits.limits_changed: the command line's limits go into the audit log."""
    if via == "cli":
        detail = "cleared" if cleared else describe_limits(limits.Limits(queue, concurrency, rate))
        Audit(user=None, action="limit_queue", via="cli", target=f"queue {queue}", actor=by).write(AuditOutcome.OK, detail)
