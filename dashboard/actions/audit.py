"""The audit trail, written by the code that acts (:func:`acting`), never by callers."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError

from dashboard.actions.errors import ActionError
from dashboard.models import AuditEntry, AuditOutcome
from dashboard.security.permissions import can_act

log = logging.getLogger("sluice.audit")

#: Ids kept per entry (the target text says how many more there were).
MAX_TARGET_IDS = 200
#: Ids spelled out in the target text.
MAX_TARGET_TEXT_IDS = 20


def describe_ids(what: str, ids: Iterable[Any]) -> str:
    """"3 messages of queue orders: a, b, c" (long lists shortened)."""
    ids = [str(i) for i in ids]
    shown = ", ".join(ids[:MAX_TARGET_TEXT_IDS])
    more = f" and {len(ids) - MAX_TARGET_TEXT_IDS} more" if len(ids) > MAX_TARGET_TEXT_IDS else ""
    return f"{len(ids)} {what}: {shown}{more}" if len(ids) != 1 else f"{what.rstrip('s')} {shown}"


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


#: What a user without the operator role is told.
OPERATORS_ONLY = "Only operators (group sluice-operator) may do this."


def record_denial(user: Any, action: str, via: str, target: str = "") -> None:
    """Audit that ``user`` (when logged in) was refused ``action`` for want of the operator role."""
    if getattr(user, "is_authenticated", False):
        Audit(user=user, action=action, via=via, target=target).write(AuditOutcome.DENIED, "not an operator")


def deny(user: Any, action: str, via: str, target: str = "") -> None:
    """Refuse a user without the operator role: audited, then PermissionDenied."""
    record_denial(user, action, via, target)
    raise PermissionDenied(OPERATORS_ONLY)


@contextmanager
def acting(user: Any, action: str, via: str = "", target: str = "") -> Iterator[Audit]:
    """Check the operator role, run the action's body, and record the outcome.

    Denied → PermissionDenied (entry ``denied``, for logged-in users); ActionError →
    re-raised (``rejected``; ``error`` for a 5xx one); a database error → ActionError 503 (``error``); anything
    else → re-raised (``error``); otherwise ``ok``."""
    audit = Audit(user=user, action=action, via=via, target=target)
    if not can_act(user):
        deny(user, action, via, target)
    try:
        yield audit
    except ActionError as exc:  # 5xx: valid, but a service failed (Redis down…)
        audit.write(AuditOutcome.ERROR if exc.status >= 500 else AuditOutcome.REJECTED, exc.message)
        raise
    except DatabaseError as exc:
        audit.write(AuditOutcome.ERROR, f"database error: {exc}")
        raise ActionError(f"The database refused the action: {exc}", 503) from exc
    except Exception as exc:
        audit.write(AuditOutcome.ERROR, f"{type(exc).__name__}: {exc}")
        raise
    else:
        audit.write(AuditOutcome.OK)
