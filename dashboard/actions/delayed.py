"""Actions on the delayed-message store and the outbox."""
from __future__ import annotations

from typing import Any, Sequence

from core.delayed import delayed_store
from core.outbox import Outbox, OutboxStore

from dashboard.actions import validate
from dashboard.actions.audit import acting, describe_ids
from dashboard.actions.errors import ActionError
from dashboard.actions.result import ActionResult


def _delayed(user: Any, action: str, ids: Sequence[str], via: str, method: str, done: str) -> ActionResult:
    with acting(user, action, via, target="delayed messages") as audit:
        ids = validate.string_ids(ids, "delayed message ids")
        audit.target, audit.ids = describe_ids("delayed messages", ids), ids
        store = delayed_store()
        if not hasattr(store, method):
            raise ActionError(f"the configured delayed store ({type(store).__name__}) cannot {done}", 501)
        count = sum(1 for i in ids if getattr(store, method)(i))
        if not count:
            raise ActionError(f"none of the {len(ids)} delayed message(s) is in the store", 404)
        audit.detail = f"{count} of {len(ids)} {done}"
    return ActionResult(action, count, f"{count} delayed message(s) {done}", audit_id=audit.entry_id)


def deliver_delayed_now(user: Any, ids: Sequence[str], *, via: str = "") -> ActionResult:
    """Make delayed messages due now (the mover forwards them within moments)."""
    return _delayed(user, "deliver_delayed_now", ids, via, "deliver_now", "delivered now")


def delete_delayed(user: Any, ids: Sequence[str], *, via: str = "") -> ActionResult:
    """Remove delayed messages from the store: they are never delivered."""
    return _delayed(user, "delete_delayed", ids, via, "delete", "deleted")


def dispatch_outbox(user: Any, message_ids: Sequence[str], *, via: str = "") -> ActionResult:
    """Dispatch undispatched outbox records now (quarantined ones too: an operator asked)."""
    with acting(user, "dispatch_outbox", via, target="outbox records") as audit:
        ids = validate.string_ids(message_ids, "outbox message ids")
        audit.target, audit.ids = describe_ids("outbox records", ids), ids
        store = OutboxStore()
        if not store.exists():
            raise ActionError(f"there is no outbox table ({store.table}); run `sluice setup`", 404)
        states = store.states(ids)
        pending = [i for i in ids if i in states and not states[i][0]]
        if not pending:
            raise ActionError("none of the records is waiting to be dispatched" if states
                              else "none of the records exists", 404 if not states else 409)
        report = Outbox().dispatch(pending, include_quarantined=True)
        failed = "; ".join(f"{k}: {v}" for k, v in list(report.failed.items())[:10])
        audit.detail = (f"{len(report.dispatched)} dispatched, {len(report.failed)} failed, "
                        f"{len(report.quarantined)} quarantined" + (f" ({failed})" if failed else ""))
    return ActionResult("dispatch_outbox", len(report.dispatched), audit.detail, audit_id=audit.entry_id)
