"""The benchmark's handlers (loaded by the worker through SLUICE_HANDLER_MODULES).

Each handled message appends one fixed-format line to the file named by
``BENCH_RECORD_FILE`` when its transaction commits: ``index start_ns commit_ns
sent_ns``, wall-clock nanoseconds, so the benchmark reads the worker's own timestamps
and never polls the database while it measures.  ``os.write`` on an O_APPEND file: one
system call per message for ``noop`` and ``orm``; one per call for the batch handler
(its lines written whole in one go).
"""
from __future__ import annotations

import json
import os
import time

from django.db import transaction

from core.demo.models import PingRecord
from benchmarks.records import BATCH, NOOP, ORM, QUEUE
from core.handlers import handler

_fd: int | None = None


def _record_fd() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["BENCH_RECORD_FILE"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return _fd


def _record(*messages, using: str | None = None) -> None:
    started = time.time_ns()
    bodies = [json.loads(message.body) for message in messages]
    fd = _record_fd()

    def committed() -> None:
        now = time.time_ns()
        os.write(fd, "".join(f"{body['i']} {started} {now} {body.get('t', 0)}\n" for body in bodies).encode())

    transaction.on_commit(committed, using=using)


@handler(QUEUE, NOOP)
def noop(message, context) -> None:
    _record(message)


@handler(QUEUE, ORM)
def orm(message, context) -> None:
    """One business row per message through the ORM, in the receive's transaction."""
    PingRecord.objects.create(message_id=message.id)
    _record(message)



@handler(QUEUE, BATCH, batch=True)
def batch(messages, context) -> None:
    """The messages of a chunk in one call: their business rows in one bulk INSERT."""
    PingRecord.objects.bulk_create([PingRecord(message_id=message.id) for message in messages])
    _record(*messages)
