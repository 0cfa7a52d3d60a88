"""Failed messages: ingested from the error queue into :class:`~core.models.FailedMessage`
records, grouped, searched, retried, archived and purged (SPEC C5, C7).

Ingestion (:class:`ErrorIngestor`, :func:`ingest_errors`) receives a batch from the
error queue and upserts one record per message id in the same transaction: the error
rows are deleted only when the records commit, so a crash loses and doubles nothing.
A message that fails again (after a retry) comes back to the same record:
``failure_count`` goes up, the status goes back to unresolved, and its history grows.

Retry (:func:`retry` + :func:`run_retry`) is a :class:`~core.models.BulkOperation`:
records are sent back to their original queues in batches, one transaction each, and
the operation's counters are updated per batch so a page can poll them.  The sent
message keeps its message id and carries ``Sluice.RetryOf``; when a handler then
succeeds the pump calls :func:`mark_resolved` in the receive's transaction.

Selections (for :func:`retry`, :func:`archive`, :func:`start_archive`)::

    ["id-1", "id-2"]                          # these message ids
    {"ids": [...]}                            # the same
    {"group": "<group_key>"}                  # one group's unresolved records
    {"all": True, "queue": "orders", "message_type": "PlaceOrder"}   # every unresolved one (filters optional)
    "all"                                     # every unresolved one

:func:`by_ids`, :func:`by_group` and :func:`all_unresolved` build them.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Count, F, Max, Min, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from core.breakers import RepeatedFailuresOverTimeCircuitBreaker
from core.conf import get_settings
from core.dialects import dialect_for
from core.errors import InvalidMessage, PoisonMessage, SluiceError, UnknownQueue
from core.messages import Headers, Message, encode_headers, parse_wire_time, timespan, wire_time
from core.models import BulkOperation, BulkOperationStatus, FailedMessage, FailureStatus
from core.queues import registry
from core.transport import Transport, OutgoingMessage, row_id_for

log = logging.getLogger("sluice.failures")

# -- settings (to move to core/conf.py as SLUICE_*; the defaults are these) -------------------
# Settings (core/conf.py): ERROR_INGESTION_BATCH_SIZE, INGEST_INTERVAL, RETRY_BATCH_SIZE,
# FAILED_ARCHIVE_RETENTION, ARCHIVE_PURGE_INTERVAL.
FAILED_PURGE_BATCH_SIZE = 1000

#: History events kept per record (the newest; a message failing forever must not grow without bound).
HISTORY_LIMIT = 100
#: Reasons kept in BulkOperation.error.
MAX_ERROR_LINES = 50
#: Parameters in one ``IN (...)`` (SQL Server allows 2,100 per statement).
MAX_IN = 500

#: Header on a retried message: the failed record it retries (its message id).
RETRY_OF = "Sluice.RetryOf"
#: Header on a retried message: when the retry was sent (wire time).
RETRIED_AT = "Sluice.RetriedAt"
POISON_TYPE = f"{PoisonMessage.__module__}.{PoisonMessage.__qualname__}"

#: Headers a retry removes: the failure description and the retry counters (a retried
#: message gets a fresh set of immediate and delayed retries).
FAILURE_HEADERS = (
    Headers.EXCEPTION_TYPE, Headers.EXCEPTION_MESSAGE, Headers.EXCEPTION_STACK_TRACE, Headers.EXCEPTION_SOURCE,
    Headers.FAILED_Q, Headers.TIME_OF_FAILURE, Headers.FAILED_ATTEMPTS, Headers.TOTAL_FAILED_ATTEMPTS,
    Headers.DELAYED_RETRIES, Headers.DELAYED_RETRIES_TIMESTAMP, Headers.TIME_TO_BE_RECEIVED, RETRIED_AT,
)
EXCEPTION_INFO_PREFIX = "NServiceBus.ExceptionInfo."


class RetryRefused(SluiceError):
    """A failed message cannot be sent back (its queue is gone, its headers unreadable…)."""


# -- grouping -------------------------------------------------------------------------------

PY_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<func>.+?)\s*$', re.MULTILINE)
NET_FRAME_RE = re.compile(r"^\s*at (?P<frame>.+?)(?: in .+)?\s*$", re.MULTILINE)


def first_frame(stack_trace: str) -> str:
    """The frame where the exception was raised, without line numbers (so edits elsewhere in a
    file do not split a group): ``dir/file.py:function`` for a Python traceback (its innermost
    frame), ``Namespace.Class.Method(args)`` for a .NET stack trace (its first ``at`` line).
    "" when there is none."""
    if not stack_trace:
        return ""
    frames = list(PY_FRAME_RE.finditer(stack_trace))
    if frames:
        last = frames[-1]  # innermost frame of the final exception (chained ones come first)
        parts = re.split(r"[\\/]", last.group("file"))
        return f"{'/'.join(parts[-2:])}:{last.group('func')}"
    match = NET_FRAME_RE.search(stack_trace)
    return match.group("frame").strip() if match else ""


def group_of(exception_type: str, stack_trace: str) -> tuple[str, str]:
    """(group_key, group_title) of a failure: exception type + the first stack frame."""
    frame = first_frame(stack_trace)
    exception_type = exception_type or "(no exception information)"
    title = f"{exception_type} @ {frame}" if frame else exception_type
    key = hashlib.sha1(f"{exception_type}\n{frame}".encode("utf-8")).hexdigest()[:16]
    return key, title[:500]


# -- ingestion ------------------------------------------------------------------------------

@dataclass
class _Failure:
    """What one error-queue message says about its failure."""

    message_id: str
    original_queue: str
    message_type: str
    exception_type: str
    exception_message: str
    stack_trace: str
    time_of_failure: dt.datetime
    attempts: int
    headers: dict[str, str]
    body: bytes


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _record_id(message_id: str) -> str:
    return message_id if len(message_id) <= 255 else "sha1:" + hashlib.sha1(message_id.encode()).hexdigest()


def _failure_of(message: Message, now: dt.datetime) -> _Failure:
    if message.poison:
        # Unreadable headers written straight into the error queue: keep the raw text.
        headers = {Headers.MESSAGE_ID: message.id, Headers.RAW_HEADERS: message.raw_headers or ""}
        return _Failure(message_id=message.id, original_queue="", message_type="", exception_type=POISON_TYPE,
                        exception_message=message.poison, stack_trace="", time_of_failure=now, attempts=0,
                        headers=headers, body=message.body or b"")
    h = message.headers
    when = now
    if h.get(Headers.TIME_OF_FAILURE):
        try:
            when = parse_wire_time(h[Headers.TIME_OF_FAILURE])
        except ValueError:
            pass
    attempts = _int(h.get(Headers.TOTAL_FAILED_ATTEMPTS))
    if attempts is None:
        attempts = _int(h.get(Headers.FAILED_ATTEMPTS)) or 0
    types = message.message_types()
    return _Failure(
        message_id=_record_id(h.get(Headers.MESSAGE_ID) or message.id),
        original_queue=h.get(Headers.DELAYED_DESTINATION, h.get(Headers.FAILED_Q, ""))[:255],
        message_type=(types[0] if types else "")[:255],
        exception_type=h.get(Headers.EXCEPTION_TYPE, "")[:500],
        exception_message=h.get(Headers.EXCEPTION_MESSAGE, ""),
        stack_trace=h.get(Headers.EXCEPTION_STACK_TRACE, ""),
        time_of_failure=when,
        attempts=attempts,
        headers=dict(h),
        body=message.body or b"",
    )


def _event(event: str, at: dt.datetime, **fields: Any) -> dict[str, Any]:
    return {"at": at.isoformat(), "event": event, **{k: v for k, v in fields.items() if v not in (None, "")}}


def _append(record: FailedMessage, event: dict[str, Any]) -> None:
    record.history = [*(record.history or []), event][-HISTORY_LIMIT:]


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _apply_failure(record: FailedMessage | None, f: _Failure, now: dt.datetime, using: str) -> FailedMessage:
    key, title = group_of(f.exception_type, f.stack_trace)
    event = _event("failed", now, exception_type=f.exception_type, message=_short(f.exception_message),
                   queue=f.original_queue, attempts=f.attempts, time_of_failure=f.time_of_failure.isoformat())
    if record is None:
        record = FailedMessage(message_id=f.message_id, first_failed_at=f.time_of_failure, failure_count=0,
                               history=[])
    else:
        record.first_failed_at = min(record.first_failed_at, f.time_of_failure)
    record.original_queue = f.original_queue
    record.message_type = f.message_type
    record.exception_type = f.exception_type
    record.exception_message = f.exception_message
    record.stack_trace = f.stack_trace
    record.group_key, record.group_title = key, title
    record.time_of_failure = f.time_of_failure
    record.attempts = f.attempts
    record.failure_count += 1
    record.status = FailureStatus.UNRESOLVED
    record.headers = encode_headers(f.headers)
    record.body = f.body
    record.last_failed_at = now
    record.resolved_at = None
    record.archived_at = None
    _append(record, event)
    record.save(using=using)
    return record


def _ingest_message(message: Message, records: dict[str, FailedMessage], now: dt.datetime, using: str) -> None:
    failure = _failure_of(message, now)
    records[failure.message_id] = _apply_failure(records.get(failure.message_id), failure, now, using)


def ingest_batch(batch_size: int | None = None, using: str | None = None,
                 queue: str | None = None) -> int:
    """Ingest up to ``batch_size`` error-queue messages in one transaction; returns how many."""
    using = using or get_settings().DATABASE
    queue = queue or get_settings().ERROR_QUEUE
    batch_size = batch_size or get_settings().ERROR_INGESTION_BATCH_SIZE
    transport = Transport(using)
    with transaction.atomic(using=using):
        messages = transport.receive_batch(queue, batch_size)
        if not messages:
            return 0
        now = timezone.now()
        ids = {_failure_of(m, now).message_id for m in messages}
        records = {r.message_id: r for r in
                   FailedMessage.objects.using(using).select_for_update().filter(message_id__in=ids)}
        for message in messages:
            _ingest_message(message, records, now, using)
    log.info("ingested %d failed message(s) from %s", len(messages), queue)
    return len(messages)


def ingest_errors(batch_size: int | None = None, max_batches: int | None = None,
                  using: str | None = None, queue: str | None = None) -> int:
    """Ingest the error queue in batches (each its own transaction) until a batch comes back
    short or ``max_batches`` ran.  Returns how many messages became (or updated) records."""
    batch_size = batch_size or get_settings().ERROR_INGESTION_BATCH_SIZE
    if not 1 <= batch_size <= MAX_IN:
        raise ValueError(f"batch_size must be between 1 and {MAX_IN}")
    total = batches = 0
    while max_batches is None or batches < max_batches:
        got = ingest_batch(batch_size, using, queue)
        total += got
        batches += 1
        if got < batch_size:
            break
    return total


class ErrorIngestor:
    """A loop (core.loops): turns error-queue messages into failed-message records."""

    name = "error-ingestion"

    def __init__(self, batch_size: int | None = None, using: str | None = None, queue: str | None = None,
                 interval: float | None = None) -> None:
        settings = get_settings()
        self.batch_size = batch_size or get_settings().ERROR_INGESTION_BATCH_SIZE
        self.using = using or settings.DATABASE
        self.queue = queue or settings.ERROR_QUEUE
        self.interval = get_settings().INGEST_INTERVAL if interval is None else interval
        self.ingested = 0
        self.breaker = RepeatedFailuresOverTimeCircuitBreaker(
            f"error-ingestion:{self.queue}", settings.TIME_TO_TRIGGER_RECEIVE_BREAKER)
        self._missing_logged = False

    def step(self) -> float:
        try:
            got = ingest_batch(self.batch_size, self.using, self.queue)
        except UnknownQueue:
            if not self._missing_logged:
                log.warning("error queue %s does not exist yet: nothing to ingest (run `sluice setup`)", self.queue)
                self._missing_logged = True
            return max(self.interval, 10.0)
        except IntegrityError:
            # Another ingestor created the same message's record first; ours rolled back
            # (the error rows with it).  Next time the record exists and is updated.
            self._discard_connection()
            return 0.0
        except DatabaseError as exc:
            self._discard_connection()
            return self.breaker.failure(exc)
        self.breaker.success()
        self._missing_logged = False
        self.ingested += got
        return 0.0 if got >= self.batch_size else self.interval

    def _discard_connection(self) -> None:
        conn = connections[self.using]
        if not conn.in_atomic_block:
            conn.close()

    def close(self) -> None:
        pass


# -- selections and bulk operations ------------------------------------------------------------

def by_ids(ids: Iterable[str]) -> dict[str, Any]:
    return {"ids": [str(i) for i in ids]}


def by_group(group_key: str) -> dict[str, Any]:
    return {"group": group_key}


def all_unresolved(queue: str | None = None, message_type: str | None = None) -> dict[str, Any]:
    sel: dict[str, Any] = {"all": True}
    if queue:
        sel["queue"] = queue
    if message_type:
        sel["message_type"] = message_type
    return sel


def _normalise(selection: Any) -> dict[str, Any]:
    if selection == "all":
        return {"all": True}
    if isinstance(selection, str):
        raise ValueError("a selection is a list of message ids, {'ids': [...]}, {'group': key} or "
                         "{'all': True, 'queue': ..., 'message_type': ...}; a single id goes in a list")
    if isinstance(selection, (list, tuple, set, frozenset)):
        return by_ids(selection)
    if isinstance(selection, Mapping):
        if "ids" in selection:
            return by_ids(selection["ids"])
        if selection.get("group"):
            sel = {"group": str(selection["group"])}
        elif selection.get("all"):
            sel = all_unresolved(selection.get("queue"), selection.get("message_type"))
        else:
            raise ValueError(f"not a selection of failed messages: {selection!r}")
        if selection.get("failed_before"):  # ISO time: only records whose latest failure is older
            sel["failed_before"] = str(selection["failed_before"])
        return sel
    raise ValueError(f"not a selection of failed messages: {selection!r}")


#: Which statuses an operation acts on: an explicit list of ids may include archived
#: records (retry); groups and "all" take unresolved ones only.
ELIGIBLE = {
    ("retry", "ids"): (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED),
    ("retry", "bulk"): (FailureStatus.UNRESOLVED,),
    ("archive", "ids"): (FailureStatus.UNRESOLVED,),
    ("archive", "bulk"): (FailureStatus.UNRESOLVED,),
}


def _base(using: str) -> QuerySet:
    return FailedMessage.objects.using(using)


def _filter_selection(qs: QuerySet, sel: Mapping[str, Any]) -> QuerySet:
    """A group / "all" selection's filters (queue, message type, failed before) on ``qs``."""
    if "group" in sel:
        qs = qs.filter(group_key=sel["group"])
    if sel.get("queue"):
        qs = qs.filter(original_queue=sel["queue"])
    if sel.get("message_type"):
        qs = qs.filter(message_type=sel["message_type"])
    if sel.get("failed_before"):
        qs = qs.filter(time_of_failure__lt=dt.datetime.fromisoformat(sel["failed_before"]))
    return qs


def _bulk_filter(sel: Mapping[str, Any], kind: str, using: str) -> QuerySet:
    return _filter_selection(_base(using).filter(status__in=ELIGIBLE[(kind, "bulk")]), sel)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _count(sel: Mapping[str, Any], kind: str, using: str) -> int:
    if "ids" in sel:
        return sum(_base(using).filter(message_id__in=chunk, status__in=ELIGIBLE[(kind, "ids")]).count()
                   for chunk in _chunks(sel["ids"], MAX_IN))
    return _bulk_filter(sel, kind, using).filter(pk__lte=sel.get("upto", 0)).count()


def _describe(sel: Mapping[str, Any], using: str) -> str:
    if "ids" in sel:
        ids = sel["ids"]
        return f"message {ids[0]}" if len(ids) == 1 else f"{len(ids)} selected messages"
    if "group" in sel:
        record = _base(using).filter(group_key=sel["group"]).only("group_title").first()
        return f"group {record.group_title if record else sel['group']}"
    text = "all unresolved"
    if sel.get("queue"):
        text += f" of queue {sel['queue']}"
    if sel.get("message_type"):
        text += f" of type {sel['message_type']}"
    return text


def _start(kind: str, selection: Any, requested_by: str, using: str | None) -> BulkOperation:
    using = using or get_settings().DATABASE
    sel = _normalise(selection)
    if "ids" not in sel:
        # Snapshot: records that fail for the first time after this are not part of the job.
        sel["upto"] = _base(using).aggregate(m=Max("pk"))["m"] or 0
    return BulkOperation.objects.using(using).create(
        kind=kind, selection=sel, description=_describe(sel, using)[:500], total=_count(sel, kind, using),
        requested_by=(requested_by or "")[:150])


def retry(selection: Any, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create a retry operation (pending) for ``selection``; run it with :func:`run_retry`
    (a Celery task in production, directly in tests and the CLI)."""
    return _start("retry", selection, requested_by, using)


def start_archive(selection: Any, requested_by: str = "", using: str | None = None) -> BulkOperation:
    """Create an archive operation (pending) for a large selection; run it with :func:`run_archive`."""
    return _start("archive", selection, requested_by, using)


def _batches(op: BulkOperation, batch_size: int, using: str) -> Iterator[QuerySet]:
    """Querysets of the records of each batch (evaluated inside the batch's transaction)."""
    sel = op.selection
    if "ids" in sel:
        for chunk in _chunks(sel["ids"], min(batch_size, MAX_IN)):
            yield _base(using).filter(message_id__in=chunk, status__in=ELIGIBLE[(op.kind, "ids")]).order_by("pk")
        return
    last = 0
    while True:
        qs = _bulk_filter(sel, op.kind, using).filter(pk__gt=last, pk__lte=sel.get("upto", 0)).order_by("pk")
        pks = list(qs.values_list("pk", flat=True)[:batch_size])
        if not pks:
            return
        last = pks[-1]
        # Re-checked under the lock: the status may have changed since.
        yield _bulk_filter(sel, op.kind, using).filter(pk__in=pks).order_by("pk")
        if len(pks) < batch_size:
            return


def run_operation(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run a pending (or interrupted) retry / archive operation in batches, one transaction
    each, updating its counters after every batch.  Safe to run again after a crash: records
    already done have left the selection's statuses."""
    using = using or get_settings().DATABASE
    batch_size = batch_size or get_settings().RETRY_BATCH_SIZE
    ops = BulkOperation.objects.using(using)
    op = ops.get(pk=operation_id)
    if op.status in (BulkOperationStatus.FINISHED, BulkOperationStatus.FAILED):
        return op
    if op.kind not in ("retry", "archive"):
        raise ValueError(f"unknown operation kind {op.kind!r}")
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.RUNNING, updated_at=timezone.now())
    reasons = [line for line in op.error.splitlines() if line]
    try:
        for qs in _batches(op, batch_size, using):
            with transaction.atomic(using=using):
                records = list(qs.select_for_update())
                done = failed = 0
                now = timezone.now()
                for record in records:
                    if op.kind == "archive":
                        _archive_one(record, now, op.requested_by, using, op.pk)
                        done += 1
                        continue
                    try:
                        with transaction.atomic(using=using):  # a savepoint: a failed insert undoes only itself
                            _send_back(record, now, op.requested_by, using, op.pk)
                        done += 1
                    except (RetryRefused, DatabaseError) as exc:
                        failed += 1
                        if len(reasons) < MAX_ERROR_LINES:
                            reasons.append(f"{record.message_id}: {exc}")
                        log.warning("retry of failed message %s refused: %s", record.message_id, exc)
                if records:
                    ops.filter(pk=op.pk).update(done=F("done") + done, failed=F("failed") + failed,
                                                error="\n".join(reasons), updated_at=timezone.now())
    except Exception as exc:
        ops.filter(pk=op.pk).update(status=BulkOperationStatus.FAILED, finished_at=timezone.now(),
                                    error="\n".join([*reasons, f"stopped: {type(exc).__name__}: {exc}"]))
        log.exception("%s operation %s stopped", op.kind, op.pk)
        raise
    op.refresh_from_db(using=using)
    # Records that left the selection meanwhile (retried, deleted…) are not counted.
    ops.filter(pk=op.pk).update(status=BulkOperationStatus.FINISHED, finished_at=timezone.now(),
                                total=min(op.total, op.done + op.failed) if op.total else op.done + op.failed)
    op.refresh_from_db(using=using)
    log.info("%s operation %s (%s) finished: %d done, %d failed", op.kind, op.pk, op.description, op.done,
             op.failed)
    return op


def run_retry(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run a retry operation made by :func:`retry`."""
    return run_operation(operation_id, batch_size, using)


def run_archive(operation_id: int, batch_size: int | None = None, using: str | None = None) -> BulkOperation:
    """Run an archive operation made by :func:`start_archive`."""
    return run_operation(operation_id, batch_size, using)


# -- sending back -----------------------------------------------------------------------------

def retry_headers(headers: Mapping[str, str], message_id: str, now: dt.datetime) -> dict[str, str]:
    """The headers a retried message carries: the failure headers removed, the retry counters
    reset, ``Sluice.RetryOf`` / ``Sluice.RetriedAt`` added, its message id kept."""
    out = _message_part(headers)
    out[Headers.MESSAGE_ID] = message_id
    out[RETRY_OF] = message_id
    out[RETRIED_AT] = wire_time(now)
    return out


def _message_part(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers without the failure description and retry counters."""
    return {k: v for k, v in headers.items() if k not in FAILURE_HEADERS and not k.startswith(EXCEPTION_INFO_PREFIX)}


def _stored_headers(record: FailedMessage) -> dict[str, str]:
    try:
        value = json.loads(record.headers or "{}")
    except ValueError as exc:
        raise RetryRefused(f"stored headers are not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise RetryRefused("stored headers are not a JSON object")
    return value


def _destination(record: FailedMessage, using: str):
    queue = (record.original_queue or "").split("@")[0]
    if not queue:
        raise RetryRefused("the original queue is unknown (no NServiceBus.FailedQ header)")
    try:
        return registry.get(queue, using)
    except (UnknownQueue, ValueError) as exc:
        raise RetryRefused(f"original queue {queue!r} no longer exists ({exc})") from None


def _insert(record: FailedMessage, headers: dict[str, str], body: bytes, using: str) -> None:
    info = _destination(record, using)
    ttl = info.effective_ttl(None)  # the queue's default TTL, counted from now
    if ttl is not None:
        headers[Headers.TIME_TO_BE_RECEIVED] = timespan(ttl)
    Transport(using).insert(OutgoingMessage(
        queue=info.name, row_id=row_id_for(record.message_id), headers=headers, body=body,
        correlation_id=headers.get(Headers.CORRELATION_ID), reply_to=headers.get(Headers.REPLY_TO_ADDRESS),
        ttl_seconds=ttl))


def _mark_retried(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None,
                  **extra: Any) -> None:
    record.status = FailureStatus.RETRY_PENDING
    record.retried_at = now
    record.archived_at = None
    _append(record, _event("retry", now, exception_type=record.exception_type, by=by, operation=operation,
                           queue=record.original_queue, **extra))
    record.save(using=using, update_fields=["status", "retried_at", "archived_at", "history", "headers", "body"])


def _send_back(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None) -> None:
    headers = _stored_headers(record)
    if record.exception_type == POISON_TYPE and Headers.RAW_HEADERS in headers:
        raise RetryRefused("poison message: its original headers could not be read; "
                           "use edit-and-retry with corrected headers")
    _insert(record, retry_headers(headers, record.message_id, now), bytes(record.body or b""), using)
    _mark_retried(record, now, by, using, operation)


def edit_and_retry(message_id: str, new_body: bytes, new_headers: Mapping[str, str] | None = None,
                   requested_by: str = "", using: str | None = None) -> FailedMessage:
    """Send a corrected copy of a failed message back to its queue (same message id), and keep
    the correction as the record's body / headers.  ``new_headers`` replace the stored ones
    (failure headers are dropped either way).  InvalidHeaders / InvalidMessage for bad input,
    RetryRefused when it cannot be sent."""
    using = using or get_settings().DATABASE
    if isinstance(new_body, str):
        new_body = new_body.encode("utf-8")
    if not isinstance(new_body, (bytes, bytearray, memoryview)):
        raise InvalidMessage("the edited body must be bytes or text")
    new_body = bytes(new_body)
    if len(new_body) > get_settings().MAX_BODY_BYTES:
        raise InvalidMessage(f"body is {len(new_body)} bytes; SLUICE_MAX_BODY_BYTES allows "
                             f"{get_settings().MAX_BODY_BYTES}")
    if new_headers is not None:
        encode_headers(new_headers)  # InvalidHeaders unless a flat string → string map
    with transaction.atomic(using=using):
        record = _base(using).select_for_update().get(message_id=message_id)
        if record.status not in (FailureStatus.UNRESOLVED, FailureStatus.ARCHIVED):
            raise RetryRefused(f"message {message_id} is {record.get_status_display()}; only unresolved or "
                               "archived messages can be edited and retried")
        stored = _stored_headers(record)
        if new_headers is None and Headers.RAW_HEADERS in stored and record.exception_type == POISON_TYPE:
            raise RetryRefused("poison message: its original headers could not be read; give corrected headers")
        base = dict(new_headers) if new_headers is not None else stored
        now = timezone.now()
        headers = retry_headers(base, record.message_id, now)
        headers.pop(Headers.RAW_HEADERS, None)
        changes = []
        if new_body != bytes(record.body or b""):
            changes.append(f"body ({len(record.body or b'')} → {len(new_body)} bytes)")
        if new_headers is not None:
            before, after = _message_part(stored), _message_part(new_headers)
            added = sorted(set(after) - set(before))
            removed = sorted(set(before) - set(after))
            changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
            for label, keys in (("added", added), ("removed", removed), ("changed", changed)):
                if keys:
                    changes.append(f"headers {label}: {', '.join(keys[:10])}")
        _insert(record, dict(headers), new_body, using)
        record.body = new_body
        if new_headers is not None:  # the failure description stays; the message part is the edited one
            failure = {k: v for k, v in stored.items() if k not in _message_part(stored)}
            record.headers = encode_headers({**failure, **_message_part(new_headers)})
        _mark_retried(record, now, requested_by, using, None, edited=True,
                      message="edited: " + ("; ".join(changes) or "no changes"))
    log.info("failed message %s edited and retried by %s", message_id, requested_by or "?")
    return record


# -- resolution, archive, restore, delete, purge --------------------------------------------------

def mark_resolved(message_id: str, using: str | None = None) -> bool:
    """A retried message was handled: its record is resolved.  Called by the pump inside the
    receive's transaction (so it commits with it).  False when there is no such record."""
    using = using or get_settings().DATABASE
    try:
        with transaction.atomic(using=using):  # a savepoint: bookkeeping must not undo the handler's work
            record = _base(using).select_for_update().filter(message_id=message_id).first()
            if record is None or record.status == FailureStatus.RESOLVED:
                return False
            now = timezone.now()
            record.status = FailureStatus.RESOLVED
            record.resolved_at = now
            record.archived_at = None
            _append(record, _event("resolved", now, exception_type=record.exception_type,
                                   message="processed successfully after a retry"))
            record.save(using=using, update_fields=["status", "resolved_at", "archived_at", "history"])
            return True
    except DatabaseError:
        if not connections[using].is_usable():
            raise  # the receive cannot commit either
        log.exception("could not mark failed message %s resolved", message_id)
        return False


def _archive_one(record: FailedMessage, now: dt.datetime, by: str, using: str, operation: int | None) -> None:
    record.status = FailureStatus.ARCHIVED
    record.archived_at = now
    _append(record, _event("archived", now, exception_type=record.exception_type, by=by, operation=operation))
    record.save(using=using, update_fields=["status", "archived_at", "history"])


def _by_status_in_batches(qs: QuerySet, using: str, batch: int, apply) -> int:
    """Apply ``apply(record, now)`` to the records of ``qs`` in batches, one transaction each."""
    count = 0
    last = 0
    while True:
        with transaction.atomic(using=using):
            records = list(qs.filter(pk__gt=last).order_by("pk").select_for_update()[:batch])
            now = timezone.now()
            for record in records:
                apply(record, now)
        count += len(records)
        if len(records) < batch:
            return count
        last = records[-1].pk


def _selection_qs(selection: Any, statuses: tuple[str, ...], using: str) -> list[QuerySet]:
    sel = _normalise(selection)
    if "ids" in sel:
        return [_base(using).filter(message_id__in=chunk, status__in=statuses)
                for chunk in _chunks(sel["ids"], MAX_IN)]
    return [_filter_selection(_base(using).filter(status__in=statuses), sel)]


def archive(selection: Any, requested_by: str = "", using: str | None = None, batch: int = 1000) -> int:
    """Archive the unresolved records of ``selection`` (ids, a group, all); returns how many.
    For a large selection behind a progress bar use :func:`start_archive` + :func:`run_archive`."""
    using = using or get_settings().DATABASE
    statuses = (FailureStatus.UNRESOLVED,)
    return sum(_by_status_in_batches(qs, using, batch,
                                     lambda r, now: _archive_one(r, now, requested_by, using, None))
               for qs in _selection_qs(selection, statuses, using))


def restore(ids: Iterable[str] | Any, requested_by: str = "", using: str | None = None) -> int:
    """Archived → unresolved; returns how many were restored."""
    using = using or get_settings().DATABASE

    def apply(record: FailedMessage, now: dt.datetime) -> None:
        record.status = FailureStatus.UNRESOLVED
        record.archived_at = None
        _append(record, _event("restored", now, exception_type=record.exception_type, by=requested_by))
        record.save(using=using, update_fields=["status", "archived_at", "history"])

    return sum(_by_status_in_batches(qs, using, 1000, apply)
               for qs in _selection_qs(ids, (FailureStatus.ARCHIVED,), using))


def delete(ids: Iterable[str], using: str | None = None) -> int:
    """Remove records for good (any status); returns how many."""
    using = using or get_settings().DATABASE
    ids = [str(i) for i in ids]
    total = 0
    for chunk in _chunks(ids, MAX_IN):
        total += _base(using).filter(message_id__in=chunk).delete()[0]
    return total


def purge_archived(older_than_seconds: float | None = None, batch: int = FAILED_PURGE_BATCH_SIZE,
                   using: str | None = None, include_resolved: bool = False) -> int:
    """Remove archived records archived more than ``older_than_seconds`` ago (and resolved ones
    resolved that long ago with ``include_resolved``), ``batch`` rows per transaction."""
    using = using or get_settings().DATABASE
    if older_than_seconds is None:
        older_than_seconds = get_settings().FAILED_ARCHIVE_RETENTION
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_seconds)
    old = Q(status=FailureStatus.ARCHIVED, archived_at__lt=cutoff)
    if include_resolved:
        old |= Q(status=FailureStatus.RESOLVED, resolved_at__lt=cutoff)
    total = 0
    while True:
        with transaction.atomic(using=using):
            pks = list(_base(using).filter(old).order_by("pk").values_list("pk", flat=True)[:batch])
            if pks:
                _base(using).filter(pk__in=pks).filter(old).delete()
        total += len(pks)
        if len(pks) < batch:
            break
    if total:
        log.info("purged %d archived failed message(s) older than %g s", total, older_than_seconds)
    return total


class ArchivedFailurePurger:
    """A loop (core.loops): removes archived failures past the retention period."""

    name = "failed-message-purge"

    def __init__(self, retention_seconds: float | None = None, interval: float | None = None,
                 using: str | None = None) -> None:
        self.retention = get_settings().FAILED_ARCHIVE_RETENTION if retention_seconds is None else retention_seconds
        self.interval = get_settings().ARCHIVE_PURGE_INTERVAL if interval is None else interval
        self.using = using or get_settings().DATABASE

    def step(self) -> float:
        purge_archived(self.retention, using=self.using)
        return self.interval

    def close(self) -> None:
        pass


# -- looking ---------------------------------------------------------------------------------------

class FailureGroup(NamedTuple):
    group_key: str
    title: str
    count: int
    last_failed: dt.datetime
    exception_type: str
    first_failed: dt.datetime | None = None


def groups(by: str = "exception", status: str = FailureStatus.UNRESOLVED, using: str | None = None,
           queue: str | None = None, message_type: str | None = None) -> list[FailureGroup]:
    """Groups of (by default unresolved) records, largest first.  ``by``: "exception" (type +
    first stack frame; the key is ``group_key``), "message_type" or "queue" (the key is the
    type / queue name, and exception_type is "")."""
    using = using or get_settings().DATABASE
    qs = _base(using).filter(status=status)
    if queue:
        qs = qs.filter(original_queue=queue)
    if message_type:
        qs = qs.filter(message_type=message_type)
    if by == "exception":
        # Counted by key alone from index sluice_fm_status_groups; each group's title and
        # exception type come from one of its rows (the key is a hash of both), fetched by id.
        rows = list(qs.order_by().values("group_key").annotate(
            n=Count("pk"), first=Min("time_of_failure"), last=Max("time_of_failure"), one=Max("pk"))
            .order_by("-n", "-last"))
        titles: dict[int, tuple[str, str]] = {}
        for chunk in _chunks([r["one"] for r in rows], MAX_IN):
            for pk, title, exception_type in _base(using).filter(pk__in=chunk).values_list(
                    "pk", "group_title", "exception_type"):
                titles[pk] = (title, exception_type)
        return [FailureGroup(r["group_key"], titles.get(r["one"], (r["group_key"],))[0], r["n"], r["last"],
                             titles.get(r["one"], ("", ""))[1], r["first"]) for r in rows]
    field = {"message_type": "message_type", "queue": "original_queue"}.get(by)
    if field is None:
        raise ValueError('groups(by=...) must be "exception", "message_type" or "queue"')
    rows = qs.order_by().values(field).annotate(n=Count("pk"), first=Min("time_of_failure"),
                                                last=Max("time_of_failure")).order_by("-n", "-last")
    return [FailureGroup(r[field], r[field] or "(none)", r["n"], r["last"], "", r["first"]) for r in rows]


def search(text: str | None = None, exception: str | None = None, message_id: str | None = None,
           queue: str | None = None, message_type: str | None = None, status: str | Iterable[str] | None = None,
           since: dt.datetime | None = None, until: dt.datetime | None = None, group: str | None = None,
           using: str | None = None) -> QuerySet:
    """Failed-message records matching every given filter, newest failure first.

    ``text`` looks (case-insensitively) in the message id, exception type and message, message
    type and queue; ``exception`` in the exception type; ``message_id`` is exact;
    ``since`` / ``until`` bound time_of_failure (inclusive / exclusive)."""
    using = using or get_settings().DATABASE
    qs = _base(using).all()
    haystack = dialect_for(connections[using]).failed_search_expression() if text else None
    if text and haystack:  # one indexed expression (PostgreSQL: trigram index sluice_fm_search)
        qs = qs.alias(haystack=RawSQL(haystack, [], output_field=TextField())).filter(
            haystack__contains=text.upper())
    elif text:
        qs = qs.filter(Q(message_id__icontains=text) | Q(exception_type__icontains=text)
                       | Q(exception_message__icontains=text) | Q(message_type__icontains=text)
                       | Q(original_queue__icontains=text))
    if exception:
        qs = qs.filter(exception_type__icontains=exception)
    if message_id:
        qs = qs.filter(message_id=message_id)
    if queue:
        qs = qs.filter(original_queue=queue)
    if message_type:
        qs = qs.filter(message_type=message_type)
    if status:
        qs = qs.filter(status=status) if isinstance(status, str) else qs.filter(status__in=list(status))
    if group:
        qs = qs.filter(group_key=group)
    if since:
        qs = qs.filter(time_of_failure__gte=since)
    if until:
        qs = qs.filter(time_of_failure__lt=until)
    return qs.order_by("-time_of_failure", "-pk")


def headers_of(record: FailedMessage) -> dict[str, str]:
    """A record's stored headers as a dict ({} when unreadable)."""
    try:
        value = json.loads(record.headers or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
