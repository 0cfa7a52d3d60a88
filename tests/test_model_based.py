"""Model-based test: random sequences of sends, Django tasks (Sluice's backend), pump and mover steps on two
"processes", a queue limited across them (tests/model_limits.py), and connection kills, checked after every step against a plain Python
model (tests/model_machine.py; the invariants in tests/model_checks.py).

Runs the bounded Hypothesis profile (SLUICE_HYPOTHESIS_PROFILE, default
``sluice-bounded``: SLUICE_MODEL_EXAMPLES examples, default 20, of up to
SLUICE_MODEL_STEPS steps, default 30); ``make soak``
runs the long one for minutes (benchmarks/soak.py).  A failure prints the rule calls
that reproduce it, shrunk, and the violated invariants.
"""
from __future__ import annotations

import os

import pytest
from django.test import override_settings
from hypothesis.stateful import run_state_machine_as_test

from core.outbox import create_outbox_table
from core.scheduling import delayed_store
from tests.conftest import database_vendor
from tests.model_faults import install_refusals
from tests.model_limits import set_up as limited_queue
from tests.model_machine import SluiceMachine, World, limit_shrinking, profile
from tests.model_support import DELAYED_RETRY_INCREASE, Proc, create_ledger, drop_ledger


@pytest.fixture
def world(make_queue, error_queue):
    delayed_store().setup_infrastructure()
    create_outbox_table()
    create_ledger()
    procs = {name: Proc(name) for name in ("A", "B", "C")}
    queue, out = make_queue("model"), make_queue("model_out")
    install_refusals(queue, out)
    SluiceMachine.world = World(queue, out, procs, can_kill=database_vendor() == "postgresql",
                                tasks=True, limited=limited_queue(make_queue("model_limited")))
    # Django tasks on the same queue (core.tasks): "default" too, the queue tests/task_funcs.py declares.
    tasks = {"default": {"BACKEND": "core.tasks.backend.SluiceTaskBackend", "QUEUES": ["default", queue]}}
    try:
        with override_settings(SLUICE_DELAYED_RETRY_INCREASE=DELAYED_RETRY_INCREASE, TASKS=tasks):
            yield SluiceMachine.world
    finally:
        for proc in procs.values():
            proc.shutdown()
        drop_ledger()


def test_random_sends_steps_and_faults_keep_every_guarantee(world):
    # SLUICE_MODEL_SHRINK_SECONDS: the mutation runs of docs/guarantees.md set it low (a
    # caught mutant needs no shrunk reproduction).
    limit_shrinking(float(os.environ.get("SLUICE_MODEL_SHRINK_SECONDS", "90")))
    run_state_machine_as_test(SluiceMachine, settings=profile())
