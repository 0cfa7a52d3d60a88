"""The transport benchmark's producer, a process of its own (so that its CPU is not the
worker's, and its Python is not the benchmark's):

    python -m benchmarks.producer MODE --type T --start I --messages N [--batch B] [--gap S]

MODE ``batches``: N messages in batches of B, each batch one ``send_many`` in one
transaction, as fast as it can.  MODE ``spaced``: N single sends, S seconds apart.
Each body is ``{"i": index, "t": wall-clock ns at the send call}``.  Prints one JSON
line: ``first_send_ns``, ``last_commit_ns`` and, for ``spaced``, ``commits_ns`` (each
send's commit time, for pick-up latency).  The environment names the database
(DATABASE_URL) as for a worker.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.producer")
    parser.add_argument("mode", choices=("batches", "spaced"))
    parser.add_argument("--type", required=True)
    parser.add_argument("--queue", default="bench")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.02)
    args = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import transaction

    from core.transport import Transport

    transport = Transport()
    transport.send_many(args.queue, [], message_type=args.type)  # warm: registry, connection
    out: dict = {"first_send_ns": time.time_ns()}
    end = args.start + args.messages
    if args.mode == "batches":
        for first in range(args.start, end, args.batch):
            now = time.time_ns()
            bodies = [{"i": i, "t": now} for i in range(first, min(first + args.batch, end))]
            with transaction.atomic():
                transport.send_many(args.queue, bodies, message_type=args.type)
    else:
        commits = []
        for i in range(args.start, end):
            transport.send(args.queue, {"i": i, "t": time.time_ns()}, message_type=args.type)
            commits.append(time.time_ns())
            time.sleep(args.gap)
        out["commits_ns"] = commits
    out["last_commit_ns"] = time.time_ns()
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
