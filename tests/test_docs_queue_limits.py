"""docs/operations/queue-limits.md runs as written: each ``$ sluice …`` line of its console
block is run against a queue called ``orders`` and prints what the page shows (times and the
operating-system user aside), and its settings example is a valid SLUICE_QUEUE_LIMITS."""
from __future__ import annotations

import ast
import json
import re
import shlex

from core.conf.options import queue_limits
from core.queues import create_queue, delete_queue
from tests.cli_support import sluice_here
from tests.conftest import ROOT

PAGE = ROOT / "docs" / "operations" / "queue-limits.md"
CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
PYTHON = re.compile(r"```python\n(.*?)```", re.S)


def session() -> list[tuple[str, str]]:
    """(command, expected output) pairs of the page's console block."""
    [block] = CONSOLE.findall(PAGE.read_text())
    pairs: list[tuple[str, str]] = []
    for line in block.strip().splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], ""))
        else:
            command, out = pairs[-1]
            pairs[-1] = (command, (out + "\n" + line).strip())
    return pairs


def matches(expected: str, got: str) -> bool:
    if expected.startswith("{"):
        want, have = json.loads(expected), json.loads(got)
        varying = {"set_at", "set_by"}
        return set(want) == set(have) and all(want[k] == have[k] for k in want if k not in varying)
    return re.fullmatch(re.escape(expected).replace(re.escape("ops (cli)"), r".+ \(cli\)"), got) is not None


def test_the_pages_commands_print_what_it_shows(transactional_db):
    pairs = session()
    assert [c for c, _ in pairs][0] == "sluice queue limit orders"
    create_queue("orders")
    try:
        for command, expected in pairs:
            result = sluice_here(*shlex.split(command)[1:])
            assert result.returncode == 0, result.stderr.decode()
            got = result.stdout.decode().strip()
            assert matches(expected, got), f"{command}:\n  page: {expected}\n  ran:  {got}"
    finally:
        delete_queue("orders")


def test_the_pages_settings_are_valid():
    [block] = PYTHON.findall(PAGE.read_text())
    value = ast.literal_eval(block.split("=", 1)[1].strip())
    assert queue_limits(value) == {"payments": (2, None), "partner-sync": (4, 10)}
