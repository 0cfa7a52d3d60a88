"""Rules and targets from plain data: the one validation every way in shares (the Alerts
page's forms, the JSON API, `sluice alerts import` / ``SLUICE_ALERTS_CONFIG``).

    {"targets": [{"name": "alertmanager", "format": "alertmanager", "url": "http://am:9093/api/v2/alerts"},
                 {"name": "oncall", "format": "email", "recipients": "ops@example.com"}],
     "rules": [{"name": "orders stalled", "kind": "stalled_queue", "window_seconds": 300,
                "filters": {"queue": "orders"}, "severity": "critical", "targets": ["alertmanager"]}]}

Bad input raises :class:`ConfigError` naming the entry and field; an import checks every
entry before it writes any (one transaction), so a bad file changes nothing.  Entries are
matched by name: an import updates what exists and adds the rest.
"""
from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction

from core.models.alerts import AlertRule, AlertTarget, RuleKind, Severity, TargetFormat
from core.conf import get_settings

TARGET_FIELDS = {"name", "format", "url", "headers", "routing_key", "recipients", "max_per_hour", "enabled"}
RULE_FIELDS = {"name", "kind", "threshold", "window_seconds", "for_seconds", "clear_after", "severity", "filters",
               "targets", "enabled"}
#: The largest number a rule or target field takes: past any real count or duration, far below
#: what overflows a float's arithmetic or a database column.
MAX_NUMBER = 1e12
#: Longest window, delay before firing: ten years, in seconds.
MAX_SECONDS = 10 * 366 * 86400
#: Most consecutive clear evaluations before a firing alert resolves (an INTEGER column).
MAX_CLEAR_AFTER = 1_000_000
FILTER_KEYS = {"queue", "worker", "breaker", "message_type", "exception_type", "header"}


class ConfigError(ValueError):
    """What is wrong, for people ("rule 'x': threshold must be a number")."""


def _text(entry: dict[str, Any], key: str, what: str, limit: int, required: bool = False) -> str:
    value = entry.get(key, "")
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ConfigError(f"{what}: {key} must be text")
    value = value.strip()
    if required and not value:
        raise ConfigError(f"{what}: {key} is required")
    if len(value) > limit:
        raise ConfigError(f"{what}: {key} is longer than {limit} characters")
    return value


def _number(entry: dict[str, Any], key: str, what: str, default: float, low: float = 0,
            high: float = MAX_NUMBER) -> float:
    """A finite number in [low, high]: inf, nan and 1e300 would be stored, then break every
    page, export and comparison that reads them."""
    value = entry.get(key, default)
    if isinstance(value, str):
        try:
            value = float(value) if value.strip() else default
        except ValueError:
            raise ConfigError(f"{what}: {key} must be a number, not {value[:40]!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what}: {key} must be a number")
    try:
        value = float(value)
    except OverflowError:  # an int past float's range
        value = math.inf
    if not math.isfinite(value):
        raise ConfigError(f"{what}: {key} must be a finite number")
    if not low <= value <= high:
        raise ConfigError(f"{what}: {key} must be between {low:g} and {high:g}")
    return value


#: Host names (letters, digits, "-", ".", "_" as in container names) or an IP address.
HOST_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _url(value: str, what: str) -> str:
    """An absolute http(s) URL whose every part is valid: it is stored, shown (scheme, host,
    port) and called, and a bad part (port 99999) would break each of them later."""
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{what}: url must not contain spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what}: url is not valid: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{what}: url must be an absolute http(s) address")
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{what}: url port must be between 1 and 65535")
    host = parts.hostname
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise ConfigError(f"{what}: url host {host[:60]!r} is not a valid IPv6 address") from None
    elif not HOST_RE.match(host) or ".." in host or len(host) > 253:
        raise ConfigError(f"{what}: url host {host[:60]!r} is not a valid host name")
    return value


def _flag(entry: dict[str, Any], key: str, default: bool = True) -> bool:
    value = entry.get(key, default)
    return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "on", "yes")


def _unknown(entry: Any, allowed: set[str], what: str) -> None:
    if not isinstance(entry, dict):
        raise ConfigError(f"{what}: must be an object")
    extra = sorted(set(entry) - allowed)
    if extra:
        raise ConfigError(f"{what}: unknown field(s) {', '.join(extra)}")


def clean_target(entry: dict[str, Any]) -> dict[str, Any]:
    """Checked target fields (raises ConfigError)."""
    what = f"target {entry.get('name', '?')!r}" if isinstance(entry, dict) else "target"
    _unknown(entry, TARGET_FIELDS, what)
    fmt = entry.get("format", TargetFormat.ALERTMANAGER)
    if fmt not in TargetFormat.values:
        raise ConfigError(f"{what}: format must be one of {', '.join(TargetFormat.values)}")
    clean = {"name": _text(entry, "name", what, 100, required=True), "format": fmt,
             "url": _text(entry, "url", what, 2000), "routing_key": _text(entry, "routing_key", what, 200),
             "recipients": _text(entry, "recipients", what, 2000),
             "max_per_hour": int(_number(entry, "max_per_hour", what, 60, high=MAX_CLEAR_AFTER)), "enabled": _flag(entry, "enabled")}
    headers = entry.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise ConfigError(f"{what}: headers must map text to text")
    if any(c in k + v for k, v in headers.items() for c in "\r\n"):
        raise ConfigError(f"{what}: header names and values must not contain line breaks")
    clean["headers"] = headers
    if fmt == TargetFormat.EMAIL:
        if not clean["recipients"] or any("@" not in r for r in clean["recipients"].split(",") if r.strip()):
            raise ConfigError(f"{what}: email targets need recipients (comma-separated addresses)")
    else:
        _url(clean["url"], what)
        if fmt == TargetFormat.PAGERDUTY and not clean["routing_key"]:
            raise ConfigError(f"{what}: PagerDuty targets need a routing_key")
    return clean


def clean_rule(entry: dict[str, Any]) -> dict[str, Any]:
    """Checked rule fields (raises ConfigError); ``targets`` stays a list of names."""
    what = f"rule {entry.get('name', '?')!r}" if isinstance(entry, dict) else "rule"
    _unknown(entry, RULE_FIELDS, what)
    if entry.get("kind") not in RuleKind.values:
        raise ConfigError(f"{what}: kind must be one of {', '.join(RuleKind.values)}")
    severity = entry.get("severity", Severity.WARNING)
    if severity not in Severity.values:
        raise ConfigError(f"{what}: severity must be one of {', '.join(Severity.values)}")
    filters = entry.get("filters") or {}
    _unknown(filters, FILTER_KEYS, f"{what}: filters")
    header = filters.get("header", {})
    if not isinstance(header, dict) or not all(isinstance(v, str) for v in header.values()):
        raise ConfigError(f"{what}: filters.header must be an object of header name → value")
    # Every other filter is a name pattern: text, never nested data an operator could make
    # deep enough to break what walks it later (an audit entry's repr, a JSON column).
    if any(not isinstance(v, (str, type(None))) for k, v in filters.items() if k != "header"):
        raise ConfigError(f"{what}: filters.{', filters.'.join(k for k, v in filters.items() if k != 'header' and not isinstance(v, (str, type(None))))} must be text")
    targets = entry.get("targets") or []
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ConfigError(f"{what}: targets must be a list of target names")
    return {"name": _text(entry, "name", what, 100, required=True), "kind": entry["kind"], "severity": severity,
            "threshold": _number(entry, "threshold", what, 0),
            "window_seconds": _number(entry, "window_seconds", what, 300, low=1, high=MAX_SECONDS),
            "for_seconds": _number(entry, "for_seconds", what, 0, high=MAX_SECONDS),
            "clear_after": int(_number(entry, "clear_after", what, 3, low=1, high=MAX_CLEAR_AFTER)),
            "filters": {k: v for k, v in filters.items() if v not in ("", None, {})}, "targets": targets,
            "enabled": _flag(entry, "enabled")}


def origin(url: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, port) of a URL, the port made explicit; None when it has none (or a bad
    port: a stored row from before ports were checked)."""
    try:
        parts = urlsplit(url or "")
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None
    return (parts.scheme.lower(), (parts.hostname or "").lower(), port) if parts.hostname else None


def moves_server(clean: dict[str, Any], target: AlertTarget) -> bool:
    """Whether an update sends a stored target to another server (scheme, host or port)."""
    return bool(target.pk and clean.get("url") and target.url and origin(clean["url"]) != origin(target.url))


def save_target(clean: dict[str, Any], pk: int | None = None) -> AlertTarget:
    """Create or update a target.  An update with an empty url / routing key / headers keeps
    the stored secret (forms never show it, so they cannot send it back) — unless the new
    url names another server: the stored routing key and headers were given for the old
    one, and an operator must not be able to send them to a server of their choosing."""
    target = AlertTarget.objects.filter(pk=pk).first() if pk else AlertTarget.objects.filter(name=clean["name"]).first()
    target = target or AlertTarget()
    keep = not moves_server(clean, target)
    for key, value in clean.items():
        if key in ("url", "routing_key", "headers") and not value and target.pk and keep:
            continue
        setattr(target, key, value)
    target.save()
    return target


def save_rule(clean: dict[str, Any], pk: int | None = None) -> AlertRule:
    names = clean.pop("targets")
    found = {t.name: t for t in AlertTarget.objects.filter(name__in=names)}
    missing = sorted(set(names) - set(found))
    if missing:
        raise ConfigError(f"rule {clean['name']!r}: no target named {', '.join(missing)}")
    rule = AlertRule.objects.filter(pk=pk).first() if pk else AlertRule.objects.filter(name=clean["name"]).first()
    rule = rule or AlertRule()
    for key, value in clean.items():
        setattr(rule, key, value)
    rule.save()
    rule.targets.set(found.values())
    return rule


def parse(text: str) -> dict[str, Any]:
    """``SLUICE_ALERTS_CONFIG``-style input: JSON text, or a path to a JSON file."""
    raw = text.strip()
    if not raw.startswith("{"):
        if not os.path.exists(raw):
            raise ConfigError(f"no alerts configuration file at {raw}")
        with open(raw, encoding="utf-8") as f:
            raw = f.read()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"the alerts configuration is not JSON: {exc}") from None
    _unknown(data, {"targets", "rules"}, "the alerts configuration")
    return data


def import_config(data: dict[str, Any]) -> dict[str, int]:
    """Check every entry, then write them all in one transaction; returns the counts."""
    _unknown(data, {"targets", "rules"}, "the alerts configuration")
    targets = [clean_target(t) for t in data.get("targets") or []]
    rules = [clean_rule(r) for r in data.get("rules") or []]
    for kind, entries in (("target", targets), ("rule", rules)):
        names = [e["name"] for e in entries]
        if len(names) != len(set(names)):
            raise ConfigError(f"two {kind}s share a name")
    with transaction.atomic(using=get_settings().DATABASE):
        for t in targets:
            save_target(t)
        for r in rules:
            save_rule(r)
    return {"targets": len(targets), "rules": len(rules)}


def finite(value: float | None) -> float | None:
    """A stored number as JSON can carry it: None for inf / nan (a row from before numbers
    were checked), which no JSON renderer takes."""
    return value if value is not None and math.isfinite(value) else None


def export_config() -> dict[str, Any]:
    """Rules and targets as import takes them, secrets left out (url, headers, routing_key)."""
    return {
        "targets": [{"name": t.name, "format": t.format, "recipients": t.recipients, "max_per_hour": t.max_per_hour,
                     "enabled": t.enabled} for t in AlertTarget.objects.all()],
        "rules": [{"name": r.name, "kind": r.kind, "threshold": finite(r.threshold),
                   "window_seconds": finite(r.window_seconds), "for_seconds": finite(r.for_seconds), "clear_after": r.clear_after, "severity": r.severity,
                   "filters": r.filters, "targets": [t.name for t in r.targets.all()], "enabled": r.enabled}
                  for r in AlertRule.objects.prefetch_related("targets")],
    }
