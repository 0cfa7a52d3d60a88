"""The invariants of the model-based test (tests/model_machine.py), checked between
steps against what the database holds.  Each check returns readable violations, one
line each, naming the message key and its plan; none is a pass.

Between steps no transaction is open, so one read of each table is a consistent picture.
"""
from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from django.db import connections

from core.conf import get_settings
from core.messages import Headers
from core.models import TaskResultRecord
from core.scheduling import delayed_store
from core.transport import Transport
from tests.model_faults import behaves_as
from tests.model_support import (BATCH_CHILDREN, CHILDREN, LEDGER, LIMIT, POISON_HEADERS, Model, fails_for_good,
                                 model_body, queued_bodies)

BROWSE_LIMIT = 100_000
#: The failure headers a message in the error queue must carry.
FAILURE_HEADERS = (Headers.EXCEPTION_TYPE, Headers.EXCEPTION_MESSAGE, Headers.FAILED_Q, Headers.TIME_OF_FAILURE)


@dataclass
class Snapshot:
    """Where each message (by key) and each child send is, right now."""

    ledger: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # key → attempts seen
    queued: Counter = field(default_factory=Counter)          # key → rows in its queue
    stored: Counter = field(default_factory=Counter)          # key → rows in the delayed store (retries)
    errors: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))  # key → error-queue headers
    children: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # key → child → copies
    results: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # task key → (status, errors, attempts)
    child_headers: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))  # key → its sends' headers


def snapshot(queue: str, out: str, model: Model | None = None) -> Snapshot:
    snap = Snapshot()
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT k, attempt FROM {LEDGER}")
        for key, attempt in cursor.fetchall():
            snap.ledger[key].append(attempt)
    transport = Transport()
    for body in queued_bodies(queue):
        snap.queued[body["k"]] += 1
    for message in transport.browse(out, limit=BROWSE_LIMIT):
        body = message.json()
        snap.children[body["parent"]][body["c"]] += 1
        snap.child_headers[body["parent"]].append(message.headers)
    for message in transport.browse(get_settings().ERROR_QUEUE, limit=BROWSE_LIMIT):
        # A message set aside (core.receive.last_resort) keeps the headers it was received
        # with (no FailedQ), plus Sluice.PoisonReason.
        if message.headers.get(Headers.FAILED_Q) == queue or Headers.POISON_REASON in message.headers:
            snap.errors[model_body(message.json())["k"]].append(message.headers)
    tasks = {sent.task_id: key for key, sent in model.sent.items() if sent.task_id} if model else {}
    if tasks:
        for pk, status, errors, workers in TaskResultRecord.objects.filter(pk__in=list(tasks)).values_list(
                "pk", "status", "errors", "worker_ids"):
            snap.results[tasks[pk]] = (status, len(errors), len(workers))
    stored, _ = delayed_store().list(BROWSE_LIMIT)
    for message in stored:
        body = _json(message.body)
        if message.destination == queue:
            snap.stored[model_body(body)["k"]] += 1
        elif message.destination == out:
            snap.children[body["parent"]][body["c"]] += 1
            snap.child_headers[body["parent"]].append(message.headers)
    return snap


def _json(body: bytes) -> dict:
    import json

    return json.loads(body)


def expected_children(plan: str, batch: bool) -> Counter:
    return Counter((BATCH_CHILDREN if batch else CHILDREN).get(behaves_as(plan), ()))


def violations(model: Model, snap: Snapshot) -> list[str]:
    """What must hold after every step."""
    found: list[str] = []
    for key, sent in model.sent.items():
        what = f"{key} ({sent.plan}{', batch' if sent.batch else ''}{f', ttl {sent.ttl:g}' if sent.ttl else ''})"
        handled = snap.ledger.get(key, [])
        if sent.rolled_back:
            if handled or snap.queued[key] or snap.stored[key] or snap.errors.get(key) or key in snap.results:
                found.append(f"{what}: sent in a rolled-back transaction, yet it exists")
            continue
        if len(handled) > 1:
            found.append(f"{what}: business row {len(handled)} times (handled more than once)")
        if handled and handled[0] != model.raises[key]:
            found.append(f"{what}: handled at Sluice.TotalFailedAttempts {handled[0]} after "
                         f"{model.raises[key]} failed handler run(s)")
        if handled and fails_for_good(sent.plan):
            found.append(f"{what}: its handler can never succeed, yet its business work committed")
        copies = snap.queued[key] + snap.stored[key] + len(snap.errors.get(key, [])) + len(handled)
        if copies > 1:
            found.append(f"{what}: {copies} copies (queue {snap.queued[key]}, delayed store {snap.stored[key]}, "
                         f"error queue {len(snap.errors.get(key, []))}, handled {len(handled)})")
        want = expected_children(sent.plan, sent.batch) if handled else Counter()
        if snap.children.get(key, Counter()) != want:
            found.append(f"{what}: sends {dict(snap.children.get(key, {}))}, expected {dict(want)} "
                         f"({'its business work committed' if handled else 'its business work did not commit'})")
        found += _error_queue(what, key, sent, model, snap)
        found += _child_headers(what, model.parents.get(key), snap.child_headers.get(key, []))
    found += _runs(model)
    return found


def _error_queue(what: str, key: str, sent, model: Model, snap: Snapshot) -> list[str]:
    found = []
    for headers in snap.errors.get(key, []):
        if sent.plan == "refused_record" or Headers.POISON_REASON in headers:
            found += _set_aside(what, sent.plan, model.raises[key], headers)
            continue
        if not fails_for_good(sent.plan):
            found.append(f"{what}: in the error queue, but its handler succeeds after "
                         f"{model.raises[key]} failure(s) (limit {LIMIT})")
        missing = [h for h in FAILURE_HEADERS if not headers.get(h)]
        if missing:
            found.append(f"{what}: in the error queue without {', '.join(missing)}")
        if sent.plan in POISON_HEADERS:
            if headers.get(Headers.RAW_HEADERS) != POISON_HEADERS[sent.plan]:
                found.append(f"{what}: poison in the error queue without its raw headers in {Headers.RAW_HEADERS}")
            continue
        total = headers.get(Headers.TOTAL_FAILED_ATTEMPTS)
        if total != str(LIMIT):
            found.append(f"{what}: in the error queue with Sluice.TotalFailedAttempts {total}, not {LIMIT}")
        counted_by_handler = not sent.plan.startswith("refused")  # a refused flush fails outside the handler
        if counted_by_handler and model.raises[key] != LIMIT:
            found.append(f"{what}: in the error queue after {model.raises[key]} failed handler run(s), not {LIMIT}")
    return found


def _set_aside(what: str, plan: str, raises: int, headers: dict) -> list[str]:
    """A message whose failure record the database refused: in the error queue as it
    was received, with the reason, after its one failed run (tests/model_faults.py)."""
    if plan != "refused_record":
        return [f"{what}: set aside ({headers.get(Headers.POISON_REASON)!r}), but nothing refuses its writes"]
    found = [] if headers.get(Headers.POISON_REASON) else [f"{what}: in the error queue without Sluice.PoisonReason"]
    if Headers.FAILED_ATTEMPTS in headers or raises != 1:
        found.append(f"{what}: set aside after {raises} failed run(s) with headers {sorted(headers)}: "
                     "not as it was received after its first failure")
    return found


def _child_headers(what: str, parent: tuple | None, sends: list[dict]) -> list[str]:
    """Each send of a handler carries its message's conversation: RelatedTo its id, its
    CorrelationId (when the column takes it), its ConversationId."""
    if parent is None:
        return []
    related_to, correlation, conversation = parent
    found = []
    for headers in sends:
        got = (headers.get(Headers.RELATED_TO), headers.get(Headers.CORRELATION_ID), headers.get(Headers.CONVERSATION_ID))
        bad = [name for name, want, have in zip(("RelatedTo", "CorrelationId", "ConversationId"),
                                                 (related_to, correlation, conversation), got)
               if want is not None and want != have]
        if bad:
            found.append(f"{what}: a send of its handler carries {', '.join(bad)} {got}, expected {parent}")
    return found


#: Clock precision the expiry comparison allows (the column's rounding).
EXPIRY_SLACK = dt.timedelta(milliseconds=2)


def _expiry(run, sent) -> str | None:
    """The run's row keeps the message's ORIGINAL expiry: the send's clock plus its TTL;
    only a delayed retry (or a delayed send) starts the TTL again, when the mover puts it
    back in its queue — never earlier than the original, never dropped."""
    if not sent.ttl or sent.task_id:
        return None
    ttl = dt.timedelta(seconds=sent.ttl)
    if run.expires is None:
        return f"{run.key}: its TTL ({sent.ttl:g} s) was dropped: the row it ran from has no Expires"
    if sent.sent_between is None:  # a delayed send: the TTL starts at the move
        low = sent.earliest + ttl if sent.earliest else None
        high = run.at + ttl
    elif run.delayed_retries:
        low, high = sent.sent_between[0] + ttl, run.at + ttl
    else:
        low, high = sent.sent_between[0] + ttl, sent.sent_between[1] + ttl
    if (low is not None and run.expires < low - EXPIRY_SLACK) or run.expires > high + EXPIRY_SLACK:
        return (f"{run.key}: ran from a row expiring at {run.expires:%H:%M:%S.%f}, its original expiry is between "
                f"{low and f'{low:%H:%M:%S.%f}'} and {high:%H:%M:%S.%f} (TTL {sent.ttl:g} s, "
                f"{run.delayed_retries} delayed retries)")
    return None


def _runs(model: Model) -> list[str]:
    """Expired messages never run; delayed messages never run early (database clock)."""
    found = []
    for run in model.runs:
        sent = model.sent.get(run.key)
        if sent is not None and sent.plan in POISON_HEADERS:
            found.append(f"{run.key}: a poison row ({sent.plan}) reached a handler")
        if run.expires is not None and run.step_started is not None and run.step_started > run.expires:
            found.append(f"{run.key}: its handler ran although it expired at {run.expires:%H:%M:%S.%f} "
                         f"before the step began ({run.step_started:%H:%M:%S.%f})")
        if sent is not None and (wrong := _expiry(run, sent)):
            found.append(wrong)
        if sent is not None and sent.earliest is not None and run.at < sent.earliest:
            found.append(f"{run.key}: delayed until at least {sent.earliest:%H:%M:%S.%f}, its handler ran at "
                         f"{run.at:%H:%M:%S.%f}")
    return found


def final_violations(model: Model, snap: Snapshot) -> list[str]:
    """What must hold once everything drained: each message handled exactly once or in
    the error queue exactly once as its plan says (or, with a TTL, possibly expired)."""
    found = []
    for key, sent in model.sent.items():
        if sent.rolled_back:
            continue
        what = f"{key} ({sent.plan}{', batch' if sent.batch else ''}{f', ttl {sent.ttl:g}' if sent.ttl else ''})"
        handled, errored = len(snap.ledger.get(key, [])), len(snap.errors.get(key, []))
        if snap.queued[key] or snap.stored[key]:
            found.append(f"{what}: still waiting after the drain (queue {snap.queued[key]}, "
                         f"delayed store {snap.stored[key]}): stuck")
            continue
        if sent.ttl and handled + errored == 0:
            continue  # expired: dropped, as its TTL allows
        if fails_for_good(sent.plan) and errored != 1:
            found.append(f"{what}: its retries ran out, but it is in the error queue {errored} time(s)"
                         + (" and was lost" if errored + handled == 0 else ""))
        if not fails_for_good(sent.plan) and handled != 1:
            found.append(f"{what}: handled {handled} time(s) after the drain, not once"
                         + (" (lost)" if errored + handled == 0 else ""))
        if sent.task_id:
            found += _task_result(what, key, sent, model, snap)
    return found


def _task_result(what: str, key: str, sent, model: Model, snap: Snapshot) -> list[str]:
    """A drained Django task's result row: SUCCESSFUL or FAILED as its plan says, one error
    per failed run and one attempt per run (core.tasks)."""
    got = snap.results.get(key)
    failed = fails_for_good(sent.plan)
    want = ("FAILED" if failed else "SUCCESSFUL", model.raises[key], model.raises[key] + (0 if failed else 1))
    if got != want:
        return [f"{what}: task result (status, errors, attempts) {got}, expected {want}"]
    return []
