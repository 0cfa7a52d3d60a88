"""make test's parts (tests/sharding.py): whole files, each in exactly one part, balanced
on the recorded times, the same split in every part."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import sharding

pytestmark = pytest.mark.no_database


def items(**tests_per_file: int) -> list:
    return [SimpleNamespace(nodeid=f"tests/{name}.py::test_{i}")
            for name, n in tests_per_file.items() for i in range(n)]


def test_every_file_goes_whole_to_exactly_one_part(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "DURATIONS", tmp_path)
    parts = sharding.split(items(a=5, b=3, c=2, d=1), 2, "sqlite")
    assert sorted(f for part in parts for f in part) == [f"tests/{n}.py" for n in "abcd"]
    assert parts == [{"tests/a.py", "tests/d.py"}, {"tests/b.py", "tests/c.py"}]  # 6 tests against 5


def test_recorded_times_balance_the_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(sharding, "DURATIONS", tmp_path)
    recorder = sharding.DurationRecorder("postgresql")
    for nodeid, seconds in [("tests/slow.py::t", 300.0), ("tests/a.py::t", 100.0), ("tests/b.py::t", 90.0),
                            ("tests/c.py::t", 80.0)]:
        recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace(option=SimpleNamespace(keyword="",
                                                                                                markexpr=""))))
    parts = sharding.split(items(slow=1, a=1, b=1, c=1), 2, "postgresql")
    assert parts == [{"tests/slow.py"}, {"tests/a.py", "tests/b.py", "tests/c.py"}]
    assert sharding.split(items(slow=1, a=1, b=1, c=1), 2, "sqlite")[0] == {"tests/a.py", "tests/c.py"}
