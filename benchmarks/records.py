"""What the benchmark's handlers (benchmarks/handlers.py) and the transport benchmark share:
the queue, the message types, and the record file's format (one line per handled
message: ``index start_ns commit_ns sent_ns``).  Free of Django, so the benchmark can
import it before setting Django up."""
from __future__ import annotations

QUEUE = "bench"
NOOP = "Noop"
ORM = "Orm"
BATCH = "Batch"


def read_records(path: str) -> list[tuple[int, ...]]:
    """(index, start_ns, commit_ns, sent_ns) per line of a record file."""
    try:
        with open(path, "rb") as f:
            return [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    except FileNotFoundError:
        return []
