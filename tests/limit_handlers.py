"""The handler of the limits' fault test (tests/test_limit_faults.py;
SLUICE_HANDLER_MODULES=tests.limit_handlers).

Queue ``LIMIT_TEST_QUEUE``, type ``Limited``, body ``{"k": key}``.  Each run appends
``start KEY PID TIME`` to the file ``LIMIT_TEST_LOG`` before its work and ``end KEY PID TIME``
after it (outside the database, so a run a SIGKILL rolled back is still counted), holds
its slot ``LIMIT_TEST_HOLD`` seconds, and writes its key, process and start time to the
ledger table :data:`LEDGER` in the receive's transaction: the ledger holds the runs that
committed.
"""
from __future__ import annotations

import os
import time

from django.db import connections

from core.handlers import handler

QUEUE = os.environ.get("LIMIT_TEST_QUEUE", "limited")
LEDGER = "sluice_limit_ledger"


def _log(what: str, key: str, at: float) -> None:
    # One short write to a file opened for appending: whole lines, whatever the processes.
    with open(os.environ["LIMIT_TEST_LOG"], "a") as log:
        log.write(f"{what} {key} {os.getpid()} {at:.6f}\n")


@handler(QUEUE, "Limited")
def limited(message, context) -> None:
    key, started = message.json()["k"], time.time()
    _log("start", key, started)
    time.sleep(float(os.environ.get("LIMIT_TEST_HOLD", "0.03")))
    with connections[context.using].cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER} (k, pid, started) VALUES (%s, %s, %s)", [key, os.getpid(), started])
    _log("end", key, time.time())
