"""Handlers for the processes-under-faults test's workers (tests/test_process_faults.py;
SLUICE_HANDLER_MODULES=tests.fault_handlers).

Queue ``FAULT_TEST_QUEUE``, type ``Fault``, body ``{"k": key, "b": plan}``; business
rows go to the model test's ledger table (tests.model_support.LEDGER), sends to
``FAULT_TEST_OUT``.  Every failed run appends ``key`` to the file ``FAULT_TEST_FAILURES``
(outside the database, so it keeps runs whose rollback a SIGKILL made for them).

Plans: ``ok``; ``slow`` (sleeps 50 ms first: work in flight when a worker is killed);
``sends`` (two sends); ``inner_rollback`` (as in tests/model_support.py); ``flakyN``
(fails while its attempt, as the engine counts it, is at most N); ``raise``.
"""
from __future__ import annotations

import os
import time

from django.db import connections, transaction

from core.handlers import handler
from tests.model_support import LEDGER

QUEUE = os.environ.get("FAULT_TEST_QUEUE", "faults")
OUT = os.environ.get("FAULT_TEST_OUT", "faults_out")


class PlannedFailure(RuntimeError):
    pass


class _Undo(Exception):
    pass


def _failed(key: str, why: str) -> None:
    with open(os.environ["FAULT_TEST_FAILURES"], "a") as log:
        log.write(key + "\n")
    raise PlannedFailure(f"{key}: {why}")


@handler(QUEUE, "Fault")
def fault(message, context) -> None:
    body = message.json()
    key, plan = body["k"], body["b"]
    if plan == "slow":
        time.sleep(0.05)
    if plan == "raise" or plan.startswith("flaky") and context.attempt <= int(plan[5:]):
        _failed(key, f"planned failure of {plan} at attempt {context.attempt}")
    with connections[context.using].cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER} (k, attempt) VALUES (%s, %s)", [key, message.total_failed_attempts])
    child = {"parent": key}
    if plan == "sends":
        context.send(OUT, {**child, "c": "c0"}, message_type="Child")
        context.send(OUT, {**child, "c": "c1"}, message_type="Child")
    elif plan == "inner_rollback":
        try:
            with transaction.atomic(using=context.using):
                context.send(OUT, {**child, "c": "c0"}, message_type="Child")
                raise _Undo()
        except _Undo:
            pass
        context.send(OUT, {**child, "c": "c1"}, message_type="Child")
