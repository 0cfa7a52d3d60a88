"""OTLP trace export requests written straight in protobuf's wire format.

The OTLP exporter's own encoder builds a protobuf object for every span, attribute and
value, about 100 µs per span of a message's ``process`` span on the machines we measure
on: more than the rest of a message's processing, and it runs in the worker's process,
under its GIL.  This encoder writes the same ``ExportTraceServiceRequest`` bytes from the
SDK's finished spans with a few byte joins, and keeps the encoded form of attribute
pairs it has seen (a batch's spans share most of theirs: system, operation, queue,
batch size, message type), so a span costs a tenth.

What it writes is what ``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans``
writes, field for field (tests/test_otlp_wire.py decodes both and compares them for
Hypothesis-made spans).  One difference by design: spans are grouped under their
resource by identity, not by equality (hashing a resource serialises its attributes as
JSON, per span); a process's spans share its provider's resource object.  Scopes are
grouped by equality, as the SDK's encoder does.

Values it does not know (anything beyond the attribute types OpenTelemetry allows)
raise :class:`Unencodable`; the caller then falls back to the SDK's encoder.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

#: Span.flags: this span's parent's "is remote" is known; and set (protocol's SpanFlags).
HAS_IS_REMOTE = 0x100
IS_REMOTE = 0x200
#: Distinct values of one key cached before the key counts as an id (its values are
#: encoded every time from then on), and pairs kept in all before the cache starts over.
DISTINCT_LIMIT = 256
CACHE_LIMIT = 20_000
#: Longer strings (a stack trace, an SQL statement) are encoded every time, not kept.
CACHED_LENGTH = 128

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_CACHED = (str, int, bool)
#: Span.flags (fixed32, field 16), for a remote parent and for a local one (or none).
_REMOTE_PARENT_FLAGS = b"\x85\x01" + _pack_fixed32(HAS_IS_REMOTE | IS_REMOTE)
_LOCAL_PARENT_FLAGS = b"\x85\x01" + _pack_fixed32(HAS_IS_REMOTE)


class Unencodable(Exception):
    """A span holds something this encoder does not write; use the SDK's encoder."""


def varint(value: int) -> bytes:
    if value < _SMALL:
        return _VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = 1 << 14
_VARINTS = [bytes((n,)) if n < 0x80 else bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(_SMALL)]


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    return tag + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """An ``AnyValue`` message's bytes, in the SDK encoder's order of type checks."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise Unencodable(f"integer {value} is outside int64")
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", any_value(item)) for item in value))
    if isinstance(value, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", key_value(str(k), v)) for k, v in value.items()))
    raise Unencodable(f"attribute value of type {type(value).__name__}")


def _status_field(status: Any) -> bytes:
    """A ``Status`` field's bytes: its description, then its code unless UNSET (0)."""
    description, code = status.description, status.status_code.value
    return _field(b"\x7a", (_field(b"\x12", description.encode("utf-8")) if description else b"")
                  + (b"\x18" + varint(code) if code else b""))


def key_field(key: str) -> bytes:
    """A ``KeyValue``'s key field (none for an empty key)."""
    return _field(b"\x0a", key.encode("utf-8")) if key else b""


def key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message's bytes (the value always present, as the SDK's encoder has it)."""
    return key_field(key) + _field(b"\x12", any_value(value))


class Encoder:
    """Encodes batches of the SDK's finished spans; one per exporter (its cache is not
    shared, and a batch span processor calls its exporter from one thread)."""

    def __init__(self) -> None:
        #: (key, string value) → the KeyValue's length prefix and bytes: looked up for a
        #: span's every attribute at once, in C (``map``), the (key, value) items as they
        #: are.  Strings only: no value of another type equals a string, so a hit is right.
        self._strings: dict[tuple[str, str], bytes] = {}
        #: (key, value's type, value) → the same, for integers and booleans: their type is
        #: part of the key, since ``True == 1`` would hand one's bytes to the other.
        self._pairs: dict[tuple[str, type, Any], bytes] = {}
        #: Values cached per key, and the keys with too many to cache (ids).
        self._distinct: dict[str, int] = {}
        self._wide: set[str] = set()
        #: Keys → their field (an id key's values are written every time, its name need not be).
        self._key_fields: dict[str, bytes] = {}
        #: Span names → their field (a process span's name is its queue's).
        self._names: dict[str, bytes] = {}
        #: The last status and span kind seen, with their fields: Sluice's spans share one
        #: status object until something fails, and a kind's ``.value`` is a slow property.
        self._status: tuple[Any, bytes] = (None, b"")
        self._kinds: dict[int, tuple[Any, bytes]] = {}
        #: Resources by identity → their encoded messages.
        self._headers: dict[int, tuple[Any, bytes]] = {}

    def request(self, spans: Sequence[Any]) -> bytes:
        """An ``ExportTraceServiceRequest``'s bytes for ``spans`` (the SDK's ReadableSpans)."""
        # resource id → scope → encoded spans; dicts keep the order of first appearance.
        grouped: dict[int, dict[Any, list[bytes]]] = {}
        for span in spans:
            resource = span.resource
            scope = span.instrumentation_scope or None
            by_scope = grouped.get(id(resource))
            if by_scope is None:
                by_scope = grouped[id(resource)] = {}
                self._remember(resource, self._resource)
            found = by_scope.get(scope)
            if found is None:
                found = by_scope[scope] = []
            found.append(_field(b"\x12", self.span(span)))
        out = []
        for resource_id, by_scope in grouped.items():
            resource, resource_bytes = self._headers[resource_id]
            scope_spans = []
            for scope, encoded in by_scope.items():
                scope_bytes = self._scope(scope)
                schema = scope.schema_url if scope is not None else None
                scope_spans.append(_field(b"\x12", _field(b"\x0a", scope_bytes) + b"".join(encoded)
                                          + (_field(b"\x1a", schema.encode()) if schema else b"")))
            schema = resource.schema_url
            out.append(_field(b"\x0a", _field(b"\x0a", resource_bytes) + b"".join(scope_spans)
                              + (_field(b"\x1a", schema.encode()) if schema else b"")))
        if len(self._pairs) + len(self._strings) > CACHE_LIMIT:  # many keys of a few values each: start over
            self._pairs.clear()
            self._strings.clear()
            self._distinct.clear()
        if len(self._names) > CACHE_LIMIT or len(self._key_fields) > CACHE_LIMIT:
            self._names.clear()
            self._key_fields.clear()
        return b"".join(out)

    def span(self, span: Any) -> bytes:
        """One ``Span`` message's bytes."""
        context = span.get_span_context()
        parent = span.parent
        out = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"), b"\x12\x08" + context.span_id.to_bytes(8, "big")]
        if context.trace_state:
            out.append(_field(b"\x1a", ",".join(f"{k}={v}" for k, v in context.trace_state.items()).encode()))
        if parent is not None:
            out.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        name = span.name
        if name:
            name_field = self._names.get(name)
            if name_field is None:
                name_field = self._names[name] = _field(b"\x2a", name.encode("utf-8"))
            out.append(name_field)
        out.append(self._kind(span.kind))
        if span.start_time:
            out.append(b"\x39" + _pack_fixed64(span.start_time))
        if span.end_time:
            out.append(b"\x41" + _pack_fixed64(span.end_time))
        out.append(self.attributes(b"\x4a", span.attributes))
        if span.dropped_attributes:
            out.append(b"\x50" + varint(span.dropped_attributes))
        for event in span.events:
            out.append(_field(b"\x5a", self._event(event)))
        if span.dropped_events:
            out.append(b"\x60" + varint(span.dropped_events))
        for link in span.links:
            out.append(_field(b"\x6a", self._link(link)))
        if span.dropped_links:
            out.append(b"\x70" + varint(span.dropped_links))
        status = span.status
        if status is not None:
            seen, status_field = self._status
            if status is not seen:
                status_field = _status_field(status)
                self._status = (status, status_field)
            out.append(status_field)
        out.append(_REMOTE_PARENT_FLAGS if parent is not None and parent.is_remote else _LOCAL_PARENT_FLAGS)
        return b"".join(out)

    def _kind(self, kind: Any) -> bytes:
        """The span kind's field, by the kind's identity (an enum member lives for ever)."""
        found = self._kinds.get(id(kind))
        if found is None or found[0] is not kind:
            found = self._kinds[id(kind)] = (kind, b"\x30" + varint(kind.value + 1))  # the protocol counts from UNSPECIFIED = 0
        return found[1]

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        """Every attribute as a ``KeyValue`` field with ``tag``; pairs seen before come
        from the cache."""
        if not attributes:
            return b""
        items = attributes.items()
        try:
            found = list(map(self._strings.get, items))
        except TypeError:  # an unhashable value (a list): every pair the long way
            found = [None] * len(attributes)
        if None in found:
            found = [encoded if encoded is not None else self._pair(key, value)
                     for (key, value), encoded in zip(items, found)]
        return tag + tag.join(found)

    def _pair(self, key: str, value: Any) -> bytes:
        """One attribute's length prefix and ``KeyValue`` bytes, kept for next time unless
        its key is an id's or its value long (an id's key field is kept all the same)."""
        kind = type(value)
        # Strings (missed in ``_strings``), integers and booleans are kept by (key, type,
        # value): the type tells their bytes apart (0.0 == -0.0, and (True,) == (1,) would not).
        cache_key = ((key, kind, value) if key not in self._wide and kind in _CACHED
                     and (kind is not str or len(value) <= CACHED_LENGTH) else None)
        if cache_key is not None:
            encoded = self._pairs.get(cache_key)
            if encoded is not None:
                return encoded
        key_bytes = self._key_fields.get(key)
        if key_bytes is None:
            key_bytes = self._key_fields[key] = key_field(key)
        found = key_bytes + _field(b"\x12", any_value(value))
        encoded = varint(len(found)) + found
        if cache_key is not None:
            self._keep(key, value, cache_key, encoded)
        return encoded

    def _keep(self, key: str, value: Any, cache_key: tuple[str, type, Any], encoded: bytes) -> None:
        seen = self._distinct[key] = self._distinct.get(key, 0) + 1
        if seen > DISTINCT_LIMIT:  # a message id: its values do not come back
            self._wide.add(key)
            for old in [k for k in self._pairs if k[0] == key]:
                del self._pairs[old]
            for old_string in [k for k in self._strings if k[0] == key]:
                del self._strings[old_string]
        elif type(value) is str:
            self._strings[(key, value)] = encoded
        else:
            self._pairs[cache_key] = encoded

    def _event(self, event: Any) -> bytes:
        return ((b"\x09" + _pack_fixed64(event.timestamp) if event.timestamp else b"")
                + (_field(b"\x12", event.name.encode("utf-8")) if event.name else b"")
                + self.attributes(b"\x1a", event.attributes)
                + (b"\x20" + varint(event.dropped_attributes) if event.dropped_attributes else b""))

    def _link(self, link: Any) -> bytes:
        context = link.context
        flags = HAS_IS_REMOTE | (IS_REMOTE if context.is_remote else 0)
        return (b"\x0a\x10" + context.trace_id.to_bytes(16, "big") + b"\x12\x08" + context.span_id.to_bytes(8, "big")
                + self.attributes(b"\x22", link.attributes)
                + (b"\x28" + varint(link.dropped_attributes) if link.dropped_attributes else b"")
                + b"\x35" + _pack_fixed32(flags))

    def _remember(self, thing: Any, encode: Any) -> None:
        if id(thing) not in self._headers or self._headers[id(thing)][0] is not thing:
            self._headers[id(thing)] = (thing, encode(thing))

    def _resource(self, resource: Any) -> bytes:
        return self.attributes(b"\x0a", resource.attributes)

    def _scope(self, scope: Any) -> bytes:
        if scope is None:
            return b""
        return ((_field(b"\x0a", scope.name.encode("utf-8")) if scope.name else b"")
                + (_field(b"\x12", scope.version.encode("utf-8")) if scope.version else b"")
                + self.attributes(b"\x1a", scope.attributes))
