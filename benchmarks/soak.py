"""``python -m benchmarks soak --db postgresql --seconds 600``: the model-based test
(tests/model_machine.py) in its long Hypothesis profile, example after example, until
the time is up; ``make soak`` runs it.

Each run of the state machine is a few examples with a fresh random seed; a violation
is logged on stderr with the shrunk rule calls that reproduce it, counted, and the
soak goes on.  One JSON line at the end:
``{"benchmark": "soak", "db": …, "examples": N, "steps": N, "messages": N, "kills": N,
"violations": N, "seconds": …}`` (``examples`` counts every example run, shrinking
included; ``kills``: connections killed with pg_terminate_backend, PostgreSQL only).
Exit status 1 when there was a violation.
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from benchmarks.common import (BENCH_DATABASE, BenchmarkError, add_database_argument, bench_database, emit_result, log, run_main,
                               setup_django)

HELP = "model-based soak: random sends, pump/mover steps and connection kills against a Python model"
#: Examples per run of the state machine: the soak looks at the clock between runs.
EXAMPLES_PER_RUN = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", "600")),
                        help="how long to run (default: $SOAK_SECONDS, else 600)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_database(args.db, name=f"{BENCH_DATABASE}_soak") as url:
        setup_django(url)
        # The engine logs every planned failure, poison row and killed connection: on
        # stderr only the soak's own progress and the violations, with their reproductions.
        logging.getLogger("sluice").setLevel(logging.CRITICAL + 1)
        return _soak(args.db, args.seconds)


def _soak(db: str, seconds: float) -> dict[str, Any]:
    from django.db import connections
    from django.test import override_settings
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    from core.outbox import create_outbox_table
    from core.queues import create_queue
    from tests.model_faults import install_refusals
    from tests.model_machine import SOAK, SluiceMachine, World, limit_shrinking
    from tests.model_support import DELAYED_RETRY_INCREASE, Proc, create_ledger

    limit_shrinking(120)
    create_outbox_table()
    create_ledger()
    create_queue("soak_model")
    create_queue("soak_model_out")
    install_refusals("soak_model", "soak_model_out")
    procs = {name: Proc(name) for name in ("A", "B", "C")}
    SluiceMachine.world = World("soak_model", "soak_model_out", procs, can_kill=db == "postgresql")
    SluiceMachine.totals.clear()
    violations, runs = 0, 0
    started = time.perf_counter()
    deadline = started + seconds
    try:
        with override_settings(SLUICE_DELAYED_RETRY_INCREASE=DELAYED_RETRY_INCREASE):
            while time.perf_counter() < deadline:
                runs += 1
                # Every run starts on fresh connections, in this thread and in each process
                # thread: a connection killed between runs (the kill rule, a server restart)
                # must not fail every run after it (seen once in a 10-minute soak).
                connections.close_all()
                for proc in procs.values():
                    proc.call(connections.close_all)
                try:
                    run_state_machine_as_test(SluiceMachine, settings=settings(
                        settings.get_profile(SOAK), max_examples=EXAMPLES_PER_RUN))
                except Exception as exc:  # a violation, shrunk: log it and go on
                    violations += 1
                    log(f"VIOLATION {violations} (run {runs}):\n{describe(exc)}")
                if runs % 10 == 0:
                    log(f"{time.perf_counter() - started:.0f} s: {dict(SluiceMachine.totals)}, "
                        f"violations {violations}")
    finally:
        for proc in procs.values():
            proc.shutdown()
    totals = SluiceMachine.totals
    return {"benchmark": "soak", "db": db, "examples": totals["examples"], "steps": totals["steps"],
            "messages": totals["messages"], "kills": totals["kills"], "violations": violations,
            "seconds": time.perf_counter() - started}


def describe(exc: BaseException) -> str:
    """A failure's text with Hypothesis's notes (the rule calls that reproduce it),
    and those of the failures inside it (a flaky failure wraps the first one)."""
    parts = [f"{type(exc).__name__}: {exc}", *getattr(exc, "__notes__", [])]
    for inner in getattr(exc, "exceptions", ()):
        parts.append(describe(inner))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    def body(argv: list[str] | None) -> None:
        parser = argparse.ArgumentParser(prog="python -m benchmarks soak", description=HELP)
        add_arguments(parser)
        result = run(parser.parse_args(argv))
        emit_result(result)
        if result["violations"]:
            raise BenchmarkError(f"{result['violations']} violation(s): see the reproductions above")

    return run_main(body, argv)
