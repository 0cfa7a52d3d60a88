"""``python -m benchmarks NAME [options]``: dispatch to the benchmark module NAME."""
from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks import BENCHMARKS


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Sluice benchmarks. Each prints progress on stderr and one JSON line on stdout.",
    )
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    modules = {}
    for name, path in BENCHMARKS.items():
        module = importlib.import_module(path)
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=getattr(module, "HELP", None),
                                            description=getattr(module, "HELP", None)))
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, modules = build_parser()
    args = parser.parse_args(argv)  # validates, and answers --help for every benchmark
    return modules[args.benchmark].main(argv[argv.index(args.benchmark) + 1:])


if __name__ == "__main__":
    sys.exit(main())
