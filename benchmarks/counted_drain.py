"""One drain of the ``otel_cost`` benchmark, run under valgrind's callgrind so that the
machine instructions it executes are counted (``otel_cost --instructions``).

    valgrind --tool=callgrind --instr-atstart=no python -m benchmarks.counted_drain RATIO COUNT WARM

The benchmark has filled the queue (its database is ``DATABASE_URL``).  This process sets
Django up, drains WARM messages uncounted, switches counting on (``callgrind_control
-i on``), drains COUNT more with tracing as RATIO says (``off``, or the share of traces
sampled), lets the span processor flush, and switches counting off.  Callgrind prints the
total on exit ("Collected : N").  Counting instructions, not seconds, gives the same
figure run after run whatever else the machine does.
"""
from __future__ import annotations

import os
import subprocess
import sys


def switch(state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


def main(argv: list[str]) -> int:
    ratio_text, count, warm = argv[0], int(argv[1]), int(argv[2])
    import django

    django.setup()
    import benchmarks.handlers  # noqa: F401 — registers the noop handler in this process
    from benchmarks.otel_cost import drain

    drain(None if ratio_text == "off" else float(ratio_text), count, warm,
          around=(lambda: switch("on"), lambda: switch("off")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
