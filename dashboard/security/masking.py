"""Payload privacy: header values and JSON body fields named in ``SLUICE_MASK_HEADERS`` /
``SLUICE_MASK_BODY_FIELDS`` are shown as ``***`` on every page, download and API response.

Only what is shown is masked: the stored message keeps its values, so a retry sends the
original.  An edit-and-retry of a masked message gets them back too (:func:`unmask_headers`,
:func:`unmask_body`): a value the operator left as ``***`` is the stored one.

Body fields are matched by object key at any depth, case-insensitively, in bodies that parse
as JSON; other bodies (XML, text, binary) are shown as they are.  A masked JSON body is shown
re-serialised (two-space indent), not byte for byte.  A body that is JSON but that Python
cannot load (a number of thousands of digits, nesting thousands deep) is withheld while
fields are masked: what it holds cannot be masked, so it is not shown.

A poison row's header text (``Sluice.RawHeaders``: headers Sluice could not use) is masked by
name like headers are, at any depth; text that is no JSON at all is withheld while header
names are masked, since the names in it cannot be told apart.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from core.conf import get_settings
from core.messages import Headers

MASK = "***"
#: What stands for a body or header text that cannot be masked (so is not shown).
WITHHELD_BODY = (b"(withheld: this body looks like JSON but cannot be parsed, so its masked fields "
                 b"(SLUICE_MASK_BODY_FIELDS) cannot be hidden)")
WITHHELD_HEADERS = ("(withheld: this header text cannot be parsed, so its masked headers "
                    "(SLUICE_MASK_HEADERS) cannot be hidden)")


class MaskedBodyInvalid(ValueError):
    """An edited body of a message with masked fields is not JSON: its masked values cannot be put back."""


def _names(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n.strip().lower() for n in names if n.strip())


def masked_header_names() -> frozenset[str]:
    return _names(get_settings().MASK_HEADERS)


def masked_fields() -> frozenset[str]:
    return _names(get_settings().MASK_BODY_FIELDS)


def mask_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` with the values of masked names replaced by ``***`` (and a poison
    message's ``Sluice.RawHeaders`` text masked within)."""
    names = masked_header_names()
    return {k: (MASK if k.lower() in names else mask_raw_headers(v) if k == Headers.RAW_HEADERS else v)
            for k, v in headers.items()}


def mask_raw_headers(text: str | None) -> str:
    """A poison row's header text as it may be shown: parsed and masked by name at any depth
    (values of any type) and re-serialised; withheld when it cannot be parsed.  As it is
    when no header is masked."""
    names = masked_header_names()
    if not names or not text:
        return text or ""
    value = _parse(text)
    if value is _NOT_JSON or value is _UNLOADABLE:
        return WITHHELD_HEADERS
    try:
        return json.dumps(_walk(value, names), ensure_ascii=False)
    except RecursionError:  # loaded, but deeper than masking's own walk can go
        return WITHHELD_HEADERS


def _walk(value: Any, fields: frozenset[str], original: Any = None, restore: bool = False) -> Any:
    """Mask (or, with ``restore``, put back from ``original``) the values of ``fields``."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            before = original.get(k) if isinstance(original, dict) else None
            if k.lower() in fields:
                out[k] = before if restore and v == MASK and isinstance(original, dict) and k in original else \
                    (v if restore else MASK)
            else:
                out[k] = _walk(v, fields, before, restore)
        return out
    if isinstance(value, list):
        befores = original if isinstance(original, list) else []
        return [_walk(v, fields, befores[i] if i < len(befores) else None, restore) for i, v in enumerate(value)]
    return value


def _parse(body: bytes | str) -> Any:
    """The JSON value of a body; _NOT_JSON when it is not JSON, _UNLOADABLE when it may be
    JSON that Python cannot load (nesting past the recursion limit, an integer past
    sys.get_int_max_str_digits(): both ValueError or RecursionError, not JSONDecodeError)."""
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):  # not JSON text at all
        return _NOT_JSON
    except (ValueError, RecursionError, TypeError):
        return _UNLOADABLE


_NOT_JSON = object()
_UNLOADABLE = object()


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def mask_body(body: bytes | memoryview | None) -> bytes:
    """The body as pages, downloads and the API show it: a JSON body with masked fields
    re-serialised; any other body (or no field configured) unchanged."""
    data = bytes(body or b"")
    fields = masked_fields()
    if not fields:
        return data
    value = _parse(data)
    if value is _NOT_JSON:
        return data
    if value is _UNLOADABLE:
        return WITHHELD_BODY
    try:
        return json.dumps(_walk(value, fields), indent=2, ensure_ascii=False).encode("utf-8")
    except RecursionError:  # loaded, but deeper than masking's own walk can go
        return WITHHELD_BODY


def mask_value(value: Any) -> Any:
    """A JSON value already loaded (a task's arguments or return value) with the fields of
    SLUICE_MASK_BODY_FIELDS masked, as mask_body masks a body's."""
    fields = masked_fields()
    if not fields:
        return value
    try:
        return _walk(value, fields)
    except RecursionError:  # deeper than masking's walk can go: not shown
        return WITHHELD_BODY.decode("utf-8")


def is_masking(body: bytes | memoryview | None) -> bool:
    """Whether ``body`` is shown differently from what is stored."""
    return bool(masked_fields()) and mask_body(body) != bytes(body or b"")


def unmask_headers(submitted: Mapping[str, str], stored: Mapping[str, str]) -> dict[str, str]:
    """Headers of an edit: a masked header still ``***`` gets its stored value."""
    names = masked_header_names()
    return {k: (stored[k] if v == MASK and k.lower() in names and k in stored else v) for k, v in submitted.items()}


def unmask_body(submitted: str, stored: bytes | memoryview | None) -> str:
    """The body of an edit: ``submitted`` with each masked field still ``***`` given its stored
    value.  The submitted text itself when the stored body shows unmasked; MaskedBodyInvalid
    when it was masked and the edit is not JSON (its values could not be put back)."""
    original = bytes(stored or b"")
    if not is_masking(original):
        return submitted
    shown = mask_body(original).decode("utf-8")
    if _lines(submitted) == _lines(shown) or submitted.encode("utf-8") == original:
        return original.decode("utf-8")  # untouched: the stored body, byte for byte
    value = _parse(submitted)
    if value is _NOT_JSON or value is _UNLOADABLE:
        raise MaskedBodyInvalid("this body has masked fields (SLUICE_MASK_BODY_FIELDS): keep it valid JSON so "
                                "their stored values can be put back")
    return json.dumps(_walk(value, masked_fields(), _parse(original), restore=True), indent=2, ensure_ascii=False)
