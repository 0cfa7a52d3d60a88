"""The benchmark's handlers (loaded by the worker through SLUICE_HANDLER_MODULES).

Each handled message appends one fixed-format line to the file named by
``BENCH_RECORD_FILE`` when its transaction commits: ``index start_ns commit_ns
sent_ns``, wall-clock nanoseconds, so the benchmark reads the worker's own timestamps
and never polls the database while it measures.  ``os.write`` on an O_APPEND file: one
system call per message, the same for every handler kind.
"""
from __future__ import annotations

import json
import os
import time

from django.db import transaction

from core.demo.models import PingRecord
from benchmarks.records import NOOP, ORM, QUEUE
from core.handlers import handler

_fd: int | None = None


def _record_fd() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["BENCH_RECORD_FILE"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return _fd


def _record(message, using: str | None = None) -> None:
    started = time.time_ns()
    body = json.loads(message.body)
    fd = _record_fd()

    def committed() -> None:
        os.write(fd, f"{body['i']} {started} {time.time_ns()} {body.get('t', 0)}\n".encode())

    transaction.on_commit(committed, using=using)


@handler(QUEUE, NOOP)
def noop(message, context) -> None:
    _record(message)


@handler(QUEUE, ORM)
def orm(message, context) -> None:
    """One business row per message through the ORM, in the receive's transaction."""
    PingRecord.objects.create(message_id=message.id)
    _record(message)

