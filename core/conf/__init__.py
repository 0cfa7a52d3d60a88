"""Sluice's settings: every ``SLUICE_*`` option, its type, default and meaning.

This is the one place they are read (:mod:`core.conf.options` defines them).  ``sluice/settings.py`` fills
them from the environment (``SLUICE_CONCURRENCY=8`` etc.); code reads them through
:func:`get_settings`, never through ``django.conf.settings`` directly.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Callable, Mapping

from core.conf.options import (ENVIRONMENTS, LOG_FORMATS, MAX_CONVERSATION_PAGE, MAX_OUTBOX_CLEANUP_BATCH,  # noqa: F401
                               MIN_PEEK_DELAY, OUTBOX_CONCURRENCY_CONTROLS, TRANSACTION_MODES, SluiceSettings)
from core.conf.values import spark_conf  # noqa: F401

FIELDS = {f.name: f for f in dataclasses.fields(SluiceSettings) if f.name != "extra"}

#: Renamed settings (names without SLUICE_): old name -> (new name, the version that drops the
#: old one).  The old name keeps working, with a SluiceDeprecationWarning, for one minor
#: version after the rename; CHANGELOG.md lists each rename under "Deprecated".
RENAMED: dict[str, tuple[str, str]] = {}


class SluiceDeprecationWarning(DeprecationWarning):
    """A setting or feature that will be removed; the message says what replaces it."""


# Python hides DeprecationWarning outside __main__; a renamed setting lives in the
# environment or a settings file, where nobody would see it.  Django logs warnings.
warnings.filterwarnings("default", category=SluiceDeprecationWarning)


def _renamed(has: Callable[[str], bool], get: Callable[[str], Any]) -> dict[str, Any]:
    """Values set under an old name, by new name (warning for each); the new name wins."""
    values = {}
    for old, (new, removed_in) in RENAMED.items():
        if has(f"SLUICE_{old}"):
            warnings.warn(f"SLUICE_{old} is renamed SLUICE_{new}; the old name stops working in "
                          f"Sluice {removed_in}", SluiceDeprecationWarning, stacklevel=3)
            if not has(f"SLUICE_{new}"):
                values[new] = get(f"SLUICE_{old}")
    return values


def _parse(name: str, raw: str) -> Any:
    """Turn an environment string into the type of setting ``name``."""
    default = FIELDS[name].default
    if FIELDS[name].default_factory is dict:  # a dict setting: JSON in the environment
        try:
            return json.loads(raw)
        except ValueError:
            raise ValueError(f"SLUICE_{name}={raw!r:.80} is not JSON") from None
    kind = type(default) if default is not None else str
    if isinstance(default, tuple):
        raw = raw.strip()
        if raw.startswith("["):
            return tuple(json.loads(raw))
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        word = raw.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("", "0", "false", "no", "off"):
            return False
        raise ValueError(f"SLUICE_{name}={raw!r} is not a yes or no (1/0, true/false, yes/no, on/off)")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise ValueError(f"SLUICE_{name}={raw!r} is not a number") from None
    return raw


def from_environ(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``SLUICE_*`` environment variables as Django settings (used by sluice/settings.py)."""
    raw = {**_renamed(environ.__contains__, environ.__getitem__),
           **{name: environ[f"SLUICE_{name}"] for name in FIELDS if f"SLUICE_{name}" in environ}}
    return {f"SLUICE_{name}": _parse(name, value) for name, value in raw.items()}


_cached: SluiceSettings | None = None


def get_settings() -> SluiceSettings:
    """The current Sluice settings, from Django's settings (``SLUICE_*``).

    Built once and cached (sends call this on the hot path); a change to a ``SLUICE_*``
    setting (``override_settings`` in tests) clears the cache.
    """
    global _cached
    if _cached is None:
        _cached = _build()
    return _cached


#: Settings that fall back to a name outside the SLUICE_ prefix (a Django setting or an
#: environment variable of that name) before their default: Redis is commonly configured once
#: for the whole project.
FALLBACKS = {"REDIS_URL": "REDIS_URL"}


def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting.startswith("SLUICE_") or setting in FALLBACKS.values():
        _cached = None


def _checked(name: str, value: Any) -> Any:
    """``value`` as the type of setting ``name``; a ValueError that names the setting and what
    it wants when it is of another type (``SLUICE_HANDLER_MODULES = "shop.handlers"``)."""
    kind = FIELDS[name].type  # the annotation's text (this module's annotations are strings)
    if kind == "tuple[str, ...]":
        if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
            return tuple(value)
        wanted = "a list or tuple of strings"
    elif kind == "bool":
        if isinstance(value, bool):
            return value
        wanted = "True or False"
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        wanted = "a whole number"
    elif kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        wanted = "a number"
    elif kind.startswith("Mapping["):
        if isinstance(value, dict):  # its items: SluiceSettings' own check, which names the bad one
            return value
        wanted = "a dict"
    elif isinstance(value, str) or (value is None and kind == "str | None"):
        return value
    else:
        wanted = "a string"
    raise ValueError(f"SLUICE_{name} must be {wanted}, not {type(value).__name__} {value!r:.80}")


def lenient_settings() -> SluiceSettings:
    """The settings, or where one fails its check the defaults in its place: for what is read
    while modules import (the unmanaged models' table names), so that a wrong setting is
    reported by the system checks (``sluice.E002``, naming it) and not by a traceback on the
    way there.  Everything else reads :func:`get_settings`, which refuses it."""
    try:
        return get_settings()
    except ValueError:
        return _build(lenient=True)


def _build(lenient: bool = False) -> SluiceSettings:
    """Each option from, in this order: the Django setting ``SLUICE_<NAME>``, the environment
    variable ``SLUICE_<NAME>``, an old name (:data:`RENAMED`, with a warning), the fallback name
    (:data:`FALLBACKS`: Django setting, then environment), the default."""
    from django.conf import settings
    from django.core.signals import setting_changed

    setting_changed.connect(_clear_cache, dispatch_uid="sluice-settings")

    values: dict[str, Any] = {}
    for name, fallback in FALLBACKS.items():
        if hasattr(settings, fallback):
            values[name] = getattr(settings, fallback)
        elif fallback in os.environ:
            values[name] = os.environ[fallback]
    values.update(_renamed(lambda name: hasattr(settings, name), lambda name: getattr(settings, name)))
    values.update({name.removeprefix("SLUICE_"): value for name, value in from_environ().items()})
    for name in FIELDS:
        if hasattr(settings, f"SLUICE_{name}"):
            values[name] = getattr(settings, f"SLUICE_{name}")
    if not lenient:
        return SluiceSettings(**{name: _checked(name, value) for name, value in values.items()})
    kept = {}
    for name, value in values.items():
        try:
            kept[name] = _checked(name, value)
        except ValueError:
            pass
    try:
        return SluiceSettings(**kept)
    except ValueError:  # a value of the right type out of range: the names, nothing else
        return SluiceSettings(**{name: kept[name] for name in ("ENDPOINT", "DELAYED_TABLE", "OUTBOX_TABLE")
                                 if name in kept})
