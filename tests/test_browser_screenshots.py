"""The README's screenshots, taken at 1280 px from a live dashboard with a real Celery worker
(hosting the pumps and demo traffic) and a real bulk retry running:

- ``docs/screenshots/overview.png``: queues, counts, workers and breakers;
- ``docs/screenshots/failed-groups.png``: failed-message groups with a bulk retry in progress.

They are written to docs/screenshots/ with ``SLUICE_SCREENSHOTS=1`` (to refresh the README),
else to a temporary directory; either way the test checks what they show."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.conftest import ROOT
from tests.dashboard_pages_support import _fresh_dashboard_cache, fail_message, make_user  # noqa: F401

from playwright.sync_api import expect  # noqa: E402

from core.queues import create_queue, delete_queue, registry  # noqa: E402
from core.transport import Transport  # noqa: E402

pytestmark = BROWSER_MARKS

QUEUES = ("orders", "billing", "shipping")


@pytest.fixture
def scene(live_server, demo, tmp_path, settings):
    """A worker hosting the pumps (demo traffic on), a few queues with messages, failures."""
    from tests.celery_support import CeleryCluster, RedisServer

    for name in QUEUES:
        create_queue(name)
    redis = RedisServer().start()
    settings.REDIS_URL = redis.url
    settings.SLUICE_DASHBOARD_CACHE_SECONDS = 1
    cluster = CeleryCluster(redis, tmp_path, env={"SLUICE_RETRY_BATCH_SIZE": "1", "SLUICE_DEMO_TRAFFIC": "1",
                                                   "SLUICE_DEMO_RATE": "5"})
    try:
        cluster.worker()
        yield cluster
    finally:
        cluster.stop_all()
        cluster.report()  # the worker's log, shown when the test failed (the bulk retry runs there)
        redis.stop()
        for name in QUEUES:
            try:
                delete_queue(name)
            finally:
                registry.forget(name)


def _out_dir(tmp_path: Path) -> Path:
    if os.environ.get("SLUICE_SCREENSHOTS") == "1":
        out = ROOT / "docs" / "screenshots"
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path


def test_screenshots(live_server, page, scene, tmp_path):
    transport = Transport()
    transport.send_many("orders", [{"order": i} for i in range(140)], message_type="PlaceOrder")
    transport.send_many("billing", [{"invoice": i} for i in range(37)], message_type="BillOrder")
    transport.send_many("shipping", [{"parcel": i} for i in range(9)], message_type="ShipOrder", ttl=0)
    for i in range(3):
        transport.send("orders", {"order": 1000 + i}, message_type="PlaceOrder", delay=600 * (i + 1))
    for _ in range(400):
        fail_message("orders", exception_type="TimeoutError", exception_message="payment gateway timed out",
                     frame="charge_card", message_type="PlaceOrder")
    for _ in range(17):
        fail_message("billing", exception_type="KeyError", exception_message="'vat_rate'", frame="compute_tax",
                     message_type="BillOrder")
    for _ in range(4):
        fail_message("shipping", exception_type="ValueError", exception_message="unknown country code 'XX'",
                     frame="validate_address", message_type="ShipOrder")
    out = _out_dir(tmp_path)
    user = make_user("operator", name="ops.alice")
    net = NetworkLog(page)
    page.on("dialog", lambda d: d.accept())

    login(page, live_server.url, user.username)
    time.sleep(6)  # a second snapshot ≥ 5 s later gives the per-minute rates
    page.reload()
    expect(page.locator('tr[data-queue="orders"]')).to_be_visible()
    expect(page.locator("#workers tr[data-worker]")).to_have_count(1)
    page.screenshot(path=str(out / "overview.png"), full_page=True)

    page.goto(f"{live_server.url}/failed/")
    row = page.locator("#groups tr", has_text="TimeoutError")
    row.get_by_role("button", name="Retry group").click()
    running = page.locator('#operations [data-status="running"]')
    # The worker takes the retry from Redis and starts it: seconds, or more on a machine
    # running four test shards at once (one CI run waited past 20 s).
    expect(running).to_have_count(1, timeout=60_000)

    def running_progress() -> int | None:
        """The running bar's value, read without waiting: the region is swapped every second,
        and under load the operation may finish between two swaps, leaving no bar to wait for."""
        return page.locator("#operations").evaluate(
            "e => { const p = e.querySelector('[data-status=\"running\"] .progress');"
            " return p ? Number(p.getAttribute('aria-valuenow') || 0) : null; }")

    # Take pictures while the bar is under way until one shows it visibly so (>= 60); keep the
    # last one taken with the bar running before and after it.
    picture, now = None, 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        before = running_progress()
        if before is None and picture is not None:
            break  # finished
        if before:
            image = page.screenshot()
            after = running_progress()
            if after:
                picture, now = image, after
                if now >= 60:
                    break
        time.sleep(0.2)
    assert picture is not None and 0 < now < 400, now
    (out / "failed-groups.png").write_bytes(picture)
    expect(page.locator('#operations [data-status="finished"]')).to_have_count(1, timeout=60_000)
    assert net.failures == []
