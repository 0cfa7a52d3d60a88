"""Where outbox operations go besides queues: destinations other packages register.

``workers.outbox`` registers ``celery``; core never imports it, it imports the modules
named in ``SLUICE_OUTBOX_DESTINATION_MODULES`` when it first meets a kind it does not
know.  Also the ``queue@alias`` addresses of queues in other configured databases.
"""
from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from django.db import connections

from core.conf import get_settings
from core.errors import InvalidMessage, SluiceError
from core.outbox.operations import QUEUE

log = logging.getLogger("sluice.outbox")


class UnknownDestination(SluiceError, LookupError):
    """An outgoing message names a database alias or destination kind nobody knows."""


@dataclass(frozen=True)
class Destination:
    """How operations of one kind are checked at send time and carried out at dispatch."""

    kind: str
    dispatch: Callable[[dict[str, Any]], None]
    validate: Callable[[dict[str, Any]], None] | None = None


_destinations: dict[str, Destination] = {}
_destinations_lock = threading.Lock()
_modules_loaded = False


def register_destination(kind: str, dispatch: Callable[[dict[str, Any]], None],
                         validate: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Let outbox operations of ``kind`` be sent: ``validate(op)`` runs at send time
    (raise to refuse), ``dispatch(op)`` in phase 2, with no transaction open (raise to
    leave the record undispatched).  ``dispatch`` may run twice for one operation (a
    crash between publishing and marking the record): make the receiver idempotent."""
    if kind == QUEUE or not isinstance(kind, str) or not kind:
        raise ValueError(f"destination kind must be a non-empty string other than {QUEUE!r}")
    with _destinations_lock:
        _destinations[kind] = Destination(kind, dispatch, validate)


def destination(kind: str) -> Destination:
    """The registered destination for ``kind``, importing the destination modules once."""
    global _modules_loaded
    found = _destinations.get(kind)
    if found is None and not _modules_loaded:
        for module in get_settings().OUTBOX_DESTINATION_MODULES:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                log.warning("outbox destination module %s cannot be imported: %s", module, exc)
        _modules_loaded = True
        found = _destinations.get(kind)
    if found is None:
        raise UnknownDestination(
            f"no outbox destination of kind {kind!r} is registered "
            f"(SLUICE_OUTBOX_DESTINATION_MODULES: {', '.join(get_settings().OUTBOX_DESTINATION_MODULES) or 'none'})"
        )
    return found


def parse_address(address: str) -> tuple[str, str | None]:
    """``queue`` or ``queue@alias`` (alias: a Django database alias) → (queue, alias or None).

    Queue names cannot contain ``@``, so the split is unambiguous."""
    if not isinstance(address, str):
        raise InvalidMessage(f"destination must be a queue name, not {address!r}")
    queue, sep, alias = address.partition("@")
    if not sep:
        return queue, None
    if not alias or "@" in alias:
        raise UnknownDestination(f"destination {address!r} should be 'queue' or 'queue@database-alias'")
    require_alias(alias, address)
    return queue, alias


def require_alias(alias: str, address: str | None = None) -> None:
    """UnknownDestination unless ``alias`` is a configured database."""
    if alias not in connections.settings:
        raise UnknownDestination(
            f"destination {address or alias!r} names database alias {alias!r}, which is not in DATABASES "
            f"(known: {', '.join(sorted(connections.settings))})"
        )
