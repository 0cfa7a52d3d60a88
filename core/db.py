"""Database connection helpers."""
from __future__ import annotations

import threading

from django.db import connections

_lock = threading.Lock()


def independent_alias(alias: str) -> str:
    """A second alias for the same database, so a transaction can run beside ``alias``'s.

    Copies the live settings of ``alias`` (under tests that is the test database).
    """
    name = f"{alias}__sluice_independent"
    with _lock:
        if name not in connections.settings:
            connections.settings[name] = dict(connections[alias].settings_dict)
    return name
