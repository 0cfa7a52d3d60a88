"""TEST-ONLY: real process deaths at the steps of the outbox's phase 1 and phase 2.

Production code reads no fault-injection setting: a test process (or a child process a
test starts, through ``python -m tests.outbox_faults SPEC ARGS…``) patches the outbox
here, then runs ``manage.py`` ARGS.  SPEC is ``point:probability,…`` with points

- ``in_handler``: after the handler ran, before its outbox record is stored;
- ``after_commit``: after phase 1 committed, before phase 2 starts;
- ``after_dispatch``: after phase 2 published, before the record is marked dispatched.

The process SIGKILLs itself (no clean-up, no rollback but the database's own).
"""
from __future__ import annotations

import os
import random
import signal
import sys

POINTS = ("in_handler", "after_commit", "after_dispatch")


def parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, probability = part.partition(":")
        if name not in POINTS:
            raise SystemExit(f"unknown fault point {name!r} (one of {', '.join(POINTS)})")
        points[name] = float(probability) if probability else 1.0
    return points


def install(spec: str, seed: int | None = None) -> None:
    """Patch the outbox so this process dies at the points of ``spec``."""
    from core.outbox import Outbox, OutboxStore
    from core.receive.transaction_modes import ChunkedOutboxScope

    points = parse(spec)
    rng = random.Random(seed)

    def point(name: str) -> None:
        if rng.random() < points.get(name, 0.0):
            sys.stderr.write(f"sluice fault injection: SIGKILL at {name}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    phase1, after_commit, mark = Outbox.phase1, Outbox.after_commit, OutboxStore.mark_dispatched
    chunk_handle = ChunkedOutboxScope.handle

    def killing_phase1(self, message_id, handler, known=None):
        def run(sender):
            result = handler(sender)
            point("in_handler")
            return result
        return phase1(self, message_id, run, known)

    def killing_chunk_handle(self, message, fn):  # the pump's path (optimistic concurrency)
        def run(message, context):
            fn(message, context)
            point("in_handler")
        return chunk_handle(self, message, run)

    def killing_after_commit(self, message_ids):
        point("after_commit")
        return after_commit(self, message_ids)

    def killing_mark(self, message_ids, token):
        point("after_dispatch")
        return mark(self, message_ids, token)

    Outbox.phase1, Outbox.after_commit, OutboxStore.mark_dispatched = (
        killing_phase1, killing_after_commit, killing_mark)
    ChunkedOutboxScope.handle = killing_chunk_handle


def main(argv: list[str]) -> None:
    """``python -m tests.outbox_faults SPEC manage.py-args…``"""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
    import django
    from django.core.management import execute_from_command_line

    django.setup()
    install(argv[0])
    execute_from_command_line(["manage.py", *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
