"""``/queues/<name>/``: browse a queue in FIFO order (keyset on RowVersion), filter, look at a
message, delete selected, purge with the queue's name typed as confirmation, move a message,
pause and resume the queue."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from core.runtime import limits, pauses
from core.errors import SluiceError, UnknownQueue
from core.messages import Headers, Message, parse_wire_time
from core.queues import list_queues, registry
from core.transport import Transport
from dashboard import actions
from dashboard.security.masking import mask_body, mask_headers, mask_raw_headers, masked_header_names
from dashboard.security.permissions import viewer_required
from dashboard.views.failed import recent_operations
from dashboard.views.tasks import result_link
from dashboard.views.common import (
    act, back_to, body_view, download, error_response, int_param, operator_only, ordered_headers, page,
)

PAGE_SIZE = 50
#: Rows one page request reads at most while filtering (a filter that matches little stops here
#: and offers "continue" rather than scanning the whole table).
SCAN_LIMIT = 2000
SCAN_CHUNK = 250
PINNED = (Headers.MESSAGE_ID, Headers.ENCLOSED_MESSAGE_TYPES, Headers.CONTENT_TYPE, Headers.TIME_SENT,
          Headers.CORRELATION_ID, Headers.REPLY_TO_ADDRESS, Headers.ORIGINATING_ENDPOINT)


@dataclass(frozen=True)
class Filters:
    message_type: str = ""
    header: str = ""
    header_value: str = ""
    min_age_minutes: int | None = None
    expired: str = ""  # "", "only", "exclude"

    @property
    def value_masked(self) -> bool:
        """A value given for a masked header (SLUICE_MASK_HEADERS): not looked at, or a viewer
        could recover the value one character at a time from which guesses list the row."""
        return bool(self.header and self.header_value) and self.header.lower() in masked_header_names()

    @property
    def active(self) -> bool:
        return bool(self.message_type or self.header or self.min_age_minutes or self.expired)

    def params(self) -> dict[str, str]:
        values = {"type": self.message_type, "header": self.header, "value": self.header_value,
                  "min_age": "" if self.min_age_minutes is None else str(self.min_age_minutes),
                  "expired": self.expired}
        return {k: v for k, v in values.items() if v}

    def matches(self, m: Message, now: dt.datetime) -> bool:
        if self.message_type and self.message_type.lower() not in (m.message_type or "").lower():
            return False
        if self.header:
            value = m.headers.get(self.header)
            if value is None or (self.header_value and not self.value_masked and self.header_value not in value):
                return False
        if self.expired == "only" and not m.expired:
            return False
        if self.expired == "exclude" and m.expired:
            return False
        if self.min_age_minutes:
            sent = sent_at(m)
            if sent is None or (now - sent).total_seconds() < self.min_age_minutes * 60:
                return False
        return True


def sent_at(m: Message) -> dt.datetime | None:
    try:
        return parse_wire_time(m.headers[Headers.TIME_SENT])
    except (KeyError, ValueError):
        return None


def _filters(request: HttpRequest) -> Filters:
    g = request.GET
    expired = g.get("expired", "")
    return Filters(message_type=g.get("type", "").strip()[:200], header=g.get("header", "").strip()[:200],
                   header_value=g.get("value", "")[:200],
                   min_age_minutes=int_param(request, "min_age", None, 1, 525600),
                   expired=expired if expired in ("only", "exclude") else "")


def _scan(transport: Transport, name: str, after: int, f: Filters) -> tuple[list[tuple[Message, int]], int, bool]:
    """Up to PAGE_SIZE matching (message, body size) after RowVersion ``after``; also the RowVersion
    to continue from and whether more rows may follow.  Reads at most SCAN_LIMIT rows, and no body."""
    found: list[tuple[Message, int]] = []
    now = timezone.now()
    scanned = 0
    cursor = after
    while scanned < SCAN_LIMIT:
        chunk = transport.browse_sizes(name, limit=PAGE_SIZE + 1 if not f.active else SCAN_CHUNK, after=cursor)
        for m, size in chunk:
            scanned += 1
            if f.matches(m, now):
                found.append((m, size))
                if len(found) > PAGE_SIZE:
                    return found[:PAGE_SIZE], found[PAGE_SIZE - 1][0].row_version, True
            cursor = m.row_version
        if len(chunk) < (PAGE_SIZE + 1 if not f.active else SCAN_CHUNK):
            return found, cursor, False
    return found, cursor, True


def _unknown(request: HttpRequest, name: str) -> HttpResponse:
    return error_response(request, f"There is no queue named {name!r}.", 404)


@dataclass
class Row:
    message: Message
    sent: dt.datetime | None
    size: int

    @property
    def message_id(self) -> str:
        return self.message.headers.get(Headers.MESSAGE_ID) or self.message.id


@viewer_required
@require_GET
def queue(request: HttpRequest, name: str) -> HttpResponse:
    transport = Transport()
    try:
        info = registry.get(name)
    except (UnknownQueue, ValueError, SluiceError):
        return _unknown(request, name)
    f = _filters(request)
    after = int_param(request, "after", 0, 0, 2**62) or 0
    problem = ""
    try:
        messages, cursor, more = _scan(transport, name, after, f)
    except DatabaseError as exc:
        messages, cursor, more = [], after, False
        problem = f"The queue table cannot be read: {exc}"
    rows = [Row(m, sent_at(m), size) for m, size in messages]
    if f.value_masked:
        problem = problem or (f"{f.header} is masked (SLUICE_MASK_HEADERS): it filters by name only; "
                              "the value is not looked at.")
    return page(request, "dashboard/queue.html", {
        "section": "queues", "name": name, "info": info, "rows": rows, "f": f, "problem": problem,
        "paused": pauses.pause_of(name), "limits": limits.limits_of(name),
        "next_url": f"?{urlencode({**f.params(), 'after': cursor})}" if more else "",
        "first_url": f"?{urlencode(f.params())}" if after else "", "after": after,
        "this_url": request.get_full_path(), **recent_operations(),  # a purge's progress bar
    })


def _message(transport: Transport, name: str, row_version: int) -> Message | None:
    if not 0 < row_version < 2**63:  # no BIGINT RowVersion: the database would refuse the number (a 500)
        return None
    found = transport.browse(name, limit=1, after=row_version - 1)
    return found[0] if found and found[0].row_version == row_version else None


@viewer_required
@require_GET
def message(request: HttpRequest, name: str, row_version: int) -> HttpResponse:
    transport = Transport()
    try:
        m = _message(transport, name, row_version)
    except (UnknownQueue, ValueError, SluiceError):
        return _unknown(request, name)
    except DatabaseError as exc:
        return error_response(request, f"The queue table cannot be read: {exc}", 503)
    if m is None:
        return error_response(request, "This message is no longer in the queue (received, deleted or "
                                       "held by a receiver right now).", 404)
    headers = ordered_headers(mask_headers(m.headers), PINNED) if not m.poison \
        else [(Headers.RAW_HEADERS, mask_raw_headers(m.raw_headers))]
    return page(request, "dashboard/message.html", {
        "section": "queues", "name": name, "m": m, "headers": headers, "body": body_view(mask_body(m.body)),
        "sent": sent_at(m), "others": [q.name for q in list_queues() if q.name != name],
        "conversation_id": m.headers.get(Headers.CONVERSATION_ID, "") if not m.poison else "",
        "task_result": None if m.poison else result_link(m.id, m.message_type),
    })


@viewer_required
@require_GET
def message_body(request: HttpRequest, name: str, row_version: int) -> HttpResponse:
    try:
        m = _message(Transport(), name, row_version)
    except (UnknownQueue, ValueError, SluiceError):
        return _unknown(request, name)
    if m is None:
        return error_response(request, "This message is no longer in the queue.", 404)
    return download(mask_body(m.body), f"{name}-{row_version}")


@operator_only("delete_messages")
@require_POST
def delete(request: HttpRequest, name: str) -> HttpResponse:
    ids = [i for i in request.POST.getlist("ids") if i]
    if not ids:  # "Delete selected" with no box ticked: say what to do, as /failed/ does
        return error_response(request, "Nothing selected: tick messages first.", 400)
    return act(request, lambda: actions.delete_messages(request.user, name, ids, via="web"),
               back_to(request, reverse("dashboard:queue", args=[name])))


@operator_only("purge_queue")
@require_POST
def purge(request: HttpRequest, name: str) -> HttpResponse:
    confirm = request.POST.get("confirm", "")
    return act(request, lambda: actions.purge_queue(request.user, name, confirm, via="web"),
               reverse("dashboard:queue", args=[name]))


@operator_only("move_message")
@require_POST
def move(request: HttpRequest, name: str) -> HttpResponse:
    message_id = request.POST.get("id", "")
    target = request.POST.get("to", "")
    return act(request, lambda: actions.move_message(request.user, name, message_id, target, via="web"),
               reverse("dashboard:queue", args=[name]))


@operator_only("pause_queue")
@require_POST
def pause(request: HttpRequest, name: str) -> HttpResponse:
    return act(request, lambda: actions.pause_queue(request.user, name, via="web"),
               back_to(request, reverse("dashboard:queue", args=[name])))


@operator_only("resume_queue")
@require_POST
def resume(request: HttpRequest, name: str) -> HttpResponse:
    return act(request, lambda: actions.resume_queue(request.user, name, via="web"),
               back_to(request, reverse("dashboard:queue", args=[name])))


@operator_only("limit_queue")
@require_POST
def limit(request: HttpRequest, name: str) -> HttpResponse:
    if request.POST.get("do") == "clear":
        work = lambda: actions.clear_queue_limits(request.user, name, via="web")  # noqa: E731
    else:
        work = lambda: actions.limit_queue(request.user, name, request.POST.get("concurrency", "").strip(),  # noqa: E731
                                           request.POST.get("rate", "").strip(), via="web")
    return act(request, work, back_to(request, reverse("dashboard:queue", args=[name])))
