"""Handlers for the chunked-receive tests' worker processes (SLUICE_HANDLER_MODULES).

Queue from ``CHUNK_TEST_QUEUE``.  Type ``Flaky``: one business row (sluice_demo_ping),
then a failure with probability ``CHUNK_TEST_FAIL_RATE``.  Type ``Stall``: the first
time (no file at ``CHUNK_TEST_MARKER``) writes its row, creates the file and hangs, so
a test can SIGKILL the worker in the middle of a chunk."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path

from core.demo.models import PingRecord
from core.handlers import handler

QUEUE = os.environ.get("CHUNK_TEST_QUEUE", "chunks")


class Flake(RuntimeError):
    pass


@handler(QUEUE, "Flaky")
def flaky(message, context) -> None:
    PingRecord.objects.using(context.using).create(message_id=message.id)
    if random.random() < float(os.environ.get("CHUNK_TEST_FAIL_RATE", "0.05")):
        raise Flake("a random failure")


@handler(QUEUE, "Stall")
def stall(message, context) -> None:
    PingRecord.objects.using(context.using).create(message_id=message.id)
    marker = Path(os.environ["CHUNK_TEST_MARKER"])
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        time.sleep(120)
