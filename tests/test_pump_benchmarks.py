"""The pump's benchmark options: `transport --handler batch` (a batch handler, one
bulk_create per call) and `delayed` with and without its visibility poller."""
from __future__ import annotations

from tests.test_transport_benchmark import run_benchmark


def test_the_transport_benchmark_runs_a_batch_handler_exactly_once():
    data = run_benchmark("transport", "--db", "sqlite", "--messages", "60", "--handler", "batch",
                         "--peek-delay", "0.05")
    assert data["handler"] == "batch" and data["duplicates"] == 0
    assert data["drained"] == 120  # every business row checked: exactly once
    for key in ("drain_per_s", "e2e_per_s", "idle_pickup_ms_p99"):
        assert data[key] is not None and data[key] >= 0, key


def test_the_delayed_benchmark_polls_for_visibility_only_when_asked():
    quiet = run_benchmark("delayed", "--db", "sqlite", "--messages", "30", "--rate", "200", "--lead", "1",
                          "--peek-delay", "0.05")
    assert quiet["visibility_poller"] is False and quiet["visible_lateness_ms_p99"] is None
    assert quiet["lateness_ms_p99"] is not None and quiet["early"] == 0 and quiet["duplicates"] == 0
    polled = run_benchmark("delayed", "--db", "sqlite", "--messages", "30", "--rate", "200", "--lead", "1",
                           "--peek-delay", "0.05", "--poll-interval", "0.005")
    assert polled["visibility_poller"] is True and polled["visible_lateness_ms_p99"] is not None
    assert polled["visible_early"] == 0
