"""The audit trail, written by the code that acts (:func:`acting`), never by callers."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError

from dashboard.actions.errors import ActionError
from dashboard.security.audit_log import Audit
from dashboard.models import AuditOutcome
from dashboard.security.roles import can_act

log = logging.getLogger("sluice.audit")

#: Ids spelled out in the target text.
MAX_TARGET_TEXT_IDS = 20


def describe_ids(what: str, ids: Iterable[Any]) -> str:
    """"3 messages of queue orders: a, b, c" (long lists shortened)."""
    ids = [str(i) for i in ids]
    shown = ", ".join(ids[:MAX_TARGET_TEXT_IDS])
    more = f" and {len(ids) - MAX_TARGET_TEXT_IDS} more" if len(ids) > MAX_TARGET_TEXT_IDS else ""
    return f"{len(ids)} {what}: {shown}{more}" if len(ids) != 1 else f"{what.rstrip('s')} {shown}"


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
