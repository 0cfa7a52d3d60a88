"""Log records as JSON lines (``SLUICE_LOG_FORMAT=json``), for a log shipper.

One object per line: ``time`` (ISO 8601 UTC), ``level``, ``logger``, ``message``,
``process``, ``thread``, and ``exception`` (the formatted traceback, newlines inside the
JSON string) when there is one.  gunicorn's access records also carry the request as
fields (``remote_addr``, ``method``, ``path``, ``status``, ``duration_ms``, …), so a
shipper need not parse the text line.  Used by Django's LOGGING (sluice/settings.py),
gunicorn (sluice/gunicorn_conf.py) and Celery (workers/celery.py).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

#: gunicorn access-log atoms → field names (see gunicorn's access_log_format).
ACCESS_FIELDS = {
    "h": "remote_addr",
    "{x-forwarded-for}i": "forwarded_for",
    "m": "method",
    "U": "path",
    "q": "query",
    "H": "protocol",
    "s": "status",
    "B": "bytes",
    "f": "referer",
    "a": "user_agent",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        if record.name == "gunicorn.access" and isinstance(record.args, Mapping):
            entry.update(access_fields(record.args))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def access_fields(atoms: Mapping[str, Any]) -> dict[str, Any]:
    """The request of one gunicorn access record; ``-`` (gunicorn's "none") left out."""
    fields = {name: atoms[atom] for atom, name in ACCESS_FIELDS.items() if atoms.get(atom) not in (None, "-")}
    for name, value in fields.items():  # gunicorn escapes quotes for its text line
        if isinstance(value, str):
            fields[name] = value.replace('\\"', '"')
    for name in ("status", "bytes"):
        if name in fields:
            try:
                fields[name] = int(fields[name])
            except (TypeError, ValueError):
                pass
    if "D" in atoms:  # microseconds
        fields["duration_ms"] = round(int(atoms["D"]) / 1000, 3)
    return fields
