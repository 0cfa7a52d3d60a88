"""How `make test` splits one database's pass into parts (``SLUICE_TEST_SHARD=K/N``, run at
once by scripts/test_passes.sh): by whole test files, balanced on each file's recorded time.

Whole files, not every Nth test: a file's module-scoped fixtures (a Celery cluster, a Spark
session, Chromium) then start in one part only, not in each, and its tests run in the same
order and next to the same neighbours as in an unsharded run.  Splitting test by test put a
file's tests beside other files' leftovers (a browser progress-bar test failed in part 1
only, never alone nor unsharded).

Balance: each part records how long each of its files took (setup + call + teardown of
every test), one small file per test file under var/test-durations/<vendor>/; the next run
hands the files out longest first, each to the part with the least time so far.  A file
never timed counts as its number of tests times the mean time per test.  Every part
computes the same split: the records are only written at the end of a run that was not
narrowed (-k, -m), minutes after every part of the pass has collected.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent.parent / "var" / "test-durations"
#: A copy of a full run's records, committed: a fresh checkout (CI) balances its parts on
#: them instead of on test counts (one file's tests differ by minutes).  Records of this
#: machine's own runs, under var/, win.
SHIPPED = Path(__file__).resolve().parent / "durations"


def test_file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _record_path(vendor: str, file: str) -> Path:
    return DURATIONS / vendor / (file.replace("/", "__") + ".seconds")


def recorded_seconds(vendor: str, files: set[str]) -> dict[str, float]:
    seconds = {}
    for file in files:
        for path in (_record_path(vendor, file), SHIPPED / vendor / _record_path(vendor, file).name):
            try:
                seconds[file] = float(path.read_text())
                break
            except (OSError, ValueError):
                pass
    return seconds


def split(items: list[pytest.Item], parts: int, vendor: str) -> list[set[str]]:
    """The test files of each part, longest first onto the least loaded part."""
    tests_per_file: dict[str, int] = defaultdict(int)
    for item in items:
        tests_per_file[test_file(item)] += 1
    seconds = recorded_seconds(vendor, set(tests_per_file))
    per_test = (sum(seconds.values()) / sum(tests_per_file[f] for f in seconds)) if seconds else 1.0
    weight = {f: seconds.get(f, n * per_test) for f, n in tests_per_file.items()}
    loads = [0.0] * parts
    files: list[set[str]] = [set() for _ in range(parts)]
    # Ties broken by name: every part must compute the same split.
    for file in sorted(weight, key=lambda f: (-weight[f], f)):
        lightest = loads.index(min(loads))
        files[lightest].add(file)
        loads[lightest] += weight[file]
    return files


class DurationRecorder:
    """Pytest plugin: each test file's total time in this run, written at the end."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        option = session.config.option
        if getattr(option, "keyword", "") or getattr(option, "markexpr", ""):
            return  # a narrowed run's times say nothing about whole files
        for file, seconds in self.seconds.items():
            path = _record_path(self.vendor, file)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(f"{seconds:.1f}\n")
            os.replace(tmp, path)
