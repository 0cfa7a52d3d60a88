"""What the ``delayed`` benchmark reads of its messages' landings (benchmarks/delayed.py):
a trigger copies every row inserted into ``demo`` to ``bench_landed``, a poller thread
reads them as they come, and the lateness statistics are computed from them."""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Any

from benchmarks.common import BenchmarkError, log

QUEUE = "demo"
LANDED_TABLE = "bench_landed"


# -- statistics -------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(prefix: str, values_ms: list[float]) -> dict[str, float | None]:
    return {
        f"{prefix}_p50": percentile(values_ms, 50),
        f"{prefix}_p99": percentile(values_ms, 99),
        f"{prefix}_max": max(values_ms) if values_ms else None,
    }


# -- the landing probe: a trigger on the demo queue and a poller thread -------------------------
def install_landing_probe() -> None:
    """``bench_landed`` gets (seq, row id, headers) of every row inserted into ``demo``."""
    from django.db import connection

    from core.transport import Transport

    queue_table = Transport().dialect.table(QUEUE)
    if connection.vendor == "postgresql":
        statements = [
            f'CREATE TABLE {LANDED_TABLE} (seq bigserial PRIMARY KEY, row_id text NOT NULL, headers text NOT NULL)',
            f"CREATE FUNCTION {LANDED_TABLE}_copy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f'INSERT INTO {LANDED_TABLE} (row_id, headers) VALUES (NEW."Id"::text, NEW."Headers"); '
            "RETURN NULL; END $$",
            f"CREATE TRIGGER {LANDED_TABLE}_copy AFTER INSERT ON {queue_table} "
            f"FOR EACH ROW EXECUTE FUNCTION {LANDED_TABLE}_copy()",
        ]
    elif connection.vendor == "sqlite":
        statements = [
            f"CREATE TABLE {LANDED_TABLE} (seq INTEGER PRIMARY KEY AUTOINCREMENT, row_id TEXT NOT NULL, "
            "headers TEXT NOT NULL)",
            f"CREATE TRIGGER {LANDED_TABLE}_copy AFTER INSERT ON {queue_table} BEGIN "
            f'INSERT INTO {LANDED_TABLE} (row_id, headers) VALUES (NEW."Id", NEW."Headers"); END',
        ]
    else:
        raise BenchmarkError(f"no landing probe for {connection.vendor}")
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def parse_landed(row_id: str, headers: str, seen: float | None) -> tuple[str, float | None, float | None, float | None]:
    """(message id, DeliveredAt epoch, DeliverAt epoch, first seen epoch) of a landed row."""
    from core.messages import Headers, parse_wire_time

    def epoch(text: str | None) -> float | None:
        return parse_wire_time(text).timestamp() if text else None

    values = json.loads(headers)
    return (values.get(Headers.MESSAGE_ID, row_id), epoch(values.get(Headers.DELIVERED_AT)),
            epoch(values.get(Headers.DELIVER_AT)), seen)


def read_landed() -> list[tuple[str, float | None, float | None, float | None]]:
    """Every landed row, read once (no poller: nothing was seen earlier)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_id, headers FROM {LANDED_TABLE} ORDER BY seq")
        return [parse_landed(row_id, headers, None) for row_id, headers in cursor.fetchall()]


def landed_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {LANDED_TABLE}")
        return cursor.fetchone()[0]


class LandingPoller(threading.Thread):
    """Reads new ``bench_landed`` rows every ``interval`` seconds on a connection of its
    own; keeps (message id, DeliveredAt epoch, DeliverAt epoch, first seen epoch)."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="bench-landed-poller", daemon=True)
        self.interval = interval
        self.rows: list[tuple[str, float | None, float | None, float]] = []
        self.polls = 0
        self.poll_seconds = 0.0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def count(self) -> int:
        with self._lock:
            return len(self.rows)

    def snapshot(self) -> list[tuple[str, float | None, float | None, float]]:
        with self._lock:
            return list(self.rows)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)

    def run(self) -> None:
        from django.db import connection

        last = 0
        sql = f"SELECT seq, row_id, headers FROM {LANDED_TABLE} WHERE seq > %s ORDER BY seq"
        try:
            while not self._stop_event.is_set():
                started = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute(sql, [last])
                    fetched = cursor.fetchall()
                seen = time.time()
                self.polls += 1
                self.poll_seconds += time.perf_counter() - started
                if fetched:
                    parsed = []
                    for seq, row_id, headers in fetched:
                        parsed.append(parse_landed(row_id, headers, seen))
                        last = seq
                    with self._lock:
                        self.rows.extend(parsed)
                self._stop_event.wait(self.interval)
        except BaseException as exc:  # noqa: BLE001 — reported by the main thread
            self.error = exc
        finally:
            connection.close()


# -- a phase's figures, from its landed rows ----------------------------------------------------
def phase_stats(label: str, dues: dict[str, float],
                landed: list[tuple[str, float | None, float | None, float | None]]) -> dict[str, Any]:
    """Lateness and counts of one phase from the landed rows of its messages."""
    mine = [row for row in landed if row[0] in dues]
    seen_ids = {row[0] for row in mine}
    missing = len(dues) - len(seen_ids)
    if missing:
        raise BenchmarkError(f"{label}: {missing} scheduled message(s) never landed")
    no_stamp = [row for row in mine if row[1] is None]
    if no_stamp:
        raise BenchmarkError(f"{label}: {len(no_stamp)} landed message(s) without a Sluice.DeliveredAt header")
    wrong_due = [row for row in mine if row[2] is None or abs(row[2] - dues[row[0]]) > 1e-6]
    if wrong_due:
        raise BenchmarkError(f"{label}: {len(wrong_due)} message(s) whose NServiceBus.DeliverAt is not the "
                             f"instant they were scheduled for")
    # The first landing of each message counts for lateness; later ones are duplicates.
    first: dict[str, tuple[str, float, float | None, float]] = {}
    for row in mine:
        first.setdefault(row[0], row)
    lateness = [(row[1] - dues[mid]) * 1000 for mid, row in first.items()]
    visible = [(row[3] - dues[mid]) * 1000 for mid, row in first.items() if row[3] is not None]
    delivered = sorted(row[1] for row in mine)
    return {
        "lateness_ms": lateness,
        "visible_ms": visible,
        "early": sum(1 for row in mine if row[1] < dues[row[0]]),
        "visible_early": sum(1 for row in mine if row[3] is not None and row[3] < dues[row[0]]),
        "landed_duplicates": len(mine) - len(seen_ids),
        "span_s": delivered[-1] - delivered[0],
        "first_delivered": delivered[0],
        "last_delivered": delivered[-1],
    }


def write_samples(path: str, landed: list[tuple[str, float | None, float | None, float | None]],
                  dues: dict[str, dict[str, float]], handled: dict[str, float]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        for mid, delivered, _, seen in landed:
            phase = next(name for name, table in dues.items() if mid in table)
            out.write(json.dumps({"phase": phase, "id": mid, "due": dues[phase][mid], "delivered_at": delivered,
                                  "seen": seen, "handled_at": handled.get(mid)}) + "\n")
    log(f"samples: {len(landed)} line(s) in {path}")
