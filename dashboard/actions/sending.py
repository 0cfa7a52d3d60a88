"""Send a message from the dashboard: an operator tries a handler or unblocks a flow.

The message goes through :meth:`core.transport.Transport.send`, the one send path (its
checks, headers, TTL ceiling and delayed store).  The form's own checks come first, so a
refused message sends nothing: the body must be JSON, the headers a JSON object of text,
and no header may be one of Sluice's control headers — ``send()`` drops those silently
(:func:`core.messages.producer_headers`), which an operator typing one would not expect."""
from __future__ import annotations

from typing import Any

from core.conf import get_settings
from core.errors import SluiceError
from core.messages import is_control_header
from core.queues import queue_model
from core.transport import Transport, row_id_for

from dashboard.actions import validate
from dashboard.actions.audit import acting
from dashboard.actions.errors import ActionError
from dashboard.actions.result import ActionResult

#: The longest message type the form takes (the header travels in every row).
MAX_TYPE_LENGTH = 200


def _headers(raw: Any) -> dict[str, str]:
    if raw in (None, ""):
        return {}
    value = validate.load_json(raw, "headers") if isinstance(raw, (str, bytes)) else raw
    if not isinstance(value, dict):
        raise ActionError("headers must be a JSON object of names to text values, e.g. {\"Tenant\": \"acme\"}")
    bad = [k for k, v in value.items() if not isinstance(v, str) or not k.strip()]
    if bad:
        raise ActionError(f"header {bad[0]!r} must have a name and a text value (quote numbers: \"7\")")
    control = sorted(k for k in value if is_control_header(k))
    if control:
        which = "are Sluice control headers" if len(control) > 1 else "is a Sluice control header"
        raise ActionError(f"{', '.join(control)}: {which} (retry counters, failure details, Sluice.*), "
                          f"which a send drops: remove {'them' if len(control) > 1 else 'it'}")
    return value


def _body(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ActionError("the body is required: a JSON document, e.g. {\"order\": 42}")
    validate.load_json(raw, "the body")
    return raw


def _seconds(raw: Any) -> Any:
    """"" and None: not given; anything else goes to the send path, which says what is wrong."""
    return None if raw is None or (isinstance(raw, str) and not raw.strip()) else raw


def send_message(user: Any, queue: str, *, body: Any, message_type: Any = "", headers: Any = None,
                 delay: Any = None, ttl: Any = None, via: str = "") -> ActionResult:
    """Send one message to ``queue`` (ActionError 400 for each bad field, 404 for an unknown
    queue; nothing is sent then), audited with who sent it.  The result says where it is:
    ``row_version`` in the queue, or ``delayed``."""
    with acting(user, "send_message", via, target=f"queue {queue}") as audit:
        info = validate.queue(queue)
        text = _body(body)
        extra = _headers(headers)
        kind = message_type.strip() if isinstance(message_type, str) else message_type
        if kind is not None and not isinstance(kind, str):
            raise ActionError("the message type must be text")
        if kind and len(kind) > MAX_TYPE_LENGTH:
            raise ActionError(f"the message type is longer than {MAX_TYPE_LENGTH} characters")
        wait = _seconds(delay)
        transport = Transport(get_settings().DATABASE)
        try:
            message_id = transport.send(info.name, text, message_type=kind or None, headers=extra or None,
                                        delay=wait, ttl=_seconds(ttl), content_type="application/json")
        except SluiceError as exc:
            raise ActionError(str(exc)) from None
        delayed = wait is not None and float(wait) > 0
        audit.target, audit.ids = f"message {message_id} to queue {info.name}", [message_id]
        audit.detail = (f"{'scheduled in ' + str(wait) + ' s' if delayed else 'sent'}"
                        f"{', type ' + kind if kind else ''}, {len(text.encode())} bytes")
    row = None if delayed else (queue_model(info.name).objects.using(transport.using)
                                .filter(message_id=row_id_for(message_id))
                                .values_list("row_version", flat=True).first())
    text = f"message {message_id} {'scheduled for' if delayed else 'sent to'} {info.name}"
    return ActionResult("send_message", 1, text, audit_id=audit.entry_id, message_id=message_id,
                        row_version=row, delayed=delayed)

