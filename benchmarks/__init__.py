"""Sluice benchmarks: ``python -m benchmarks NAME [options]``.

Each benchmark is a module of this package that provides

- ``HELP``: one line for ``python -m benchmarks --help``;
- ``add_arguments(parser)``: its command-line options;
- ``run(args) -> dict``: the measurement, returning the result record;
- ``main(argv) -> int``: parse ``argv``, run, print the one JSON line on stdout.

Every benchmark runs against a database of its own (a temporary SQLite file or a
fresh PostgreSQL database ``sluice_bench``) and removes it afterwards.  Progress goes
to stderr; stdout carries exactly one JSON line, the result.
"""

#: Benchmark name → module (relative to this package).  Add new benchmarks here.
BENCHMARKS: dict[str, str] = {
    "transport": "benchmarks.transport",
    "otel_cost": "benchmarks.otel_cost",
    "delayed": "benchmarks.delayed",
    "purge": "benchmarks.purge",
    "outbox": "benchmarks.outbox",
    "dashboard": "benchmarks.dashboard",
    "pipeline": "benchmarks.pipeline",
    "export": "benchmarks.export",
    "long_drain": "benchmarks.long_drain",
    "soak": "benchmarks.soak",
    "tasks": "benchmarks.tasks",
    "costs": "benchmarks.costs",
    "horizon": "benchmarks.horizon",
}
