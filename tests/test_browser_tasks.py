"""A failed Django task in a real browser (headless Chromium, Playwright) against the live
server: the task runs on Sluice's backend, fails every attempt, reaches the error queue and
is ingested; a viewer logs in on its failed-message page, follows "Task result" to the
result page, sees FAILED and the error, and opens the earlier attempt's traceback.  No
request of the pages answers 4xx/5xx, and the result page keeps to the
Content-Security-Policy.  Setup: tests/browser_support.py."""
from __future__ import annotations

from tests.browser_support import (  # noqa: F401 — fixtures
    BROWSER_MARKS, NetworkLog, browser_context_args, browser_type_launch_args, login,
)
from tests.conftest import drain
from tests.dashboard_pages_support import _fresh_dashboard_cache, make_user  # noqa: F401
from tests.tasks_support import tasks_on_sluice  # noqa: F401
from tests.test_browser_csp import LISTEN

from playwright.sync_api import expect  # noqa: E402

from core.failures import ingest_errors  # noqa: E402
from core.models import FailedMessage  # noqa: E402

pytestmark = BROWSER_MARKS


def test_a_viewer_follows_a_failed_tasks_link_to_its_result(live_server, page, tasks_on_sluice,  # noqa: F811
                                                            pump_for):
    from tests import task_funcs

    task_funcs.FAIL_NEXT["browser"] = 2
    result = task_funcs.flaky.enqueue("browser")
    drain(pump_for(tasks_on_sluice.queue, concurrency=1, immediate_retries=1))
    ingest_errors()
    record = FailedMessage.objects.get(message_id=result.id)
    net = NetworkLog(page)
    page.add_init_script(LISTEN)  # Content-Security-Policy violations, recorded

    login(page, live_server.url, make_user("viewer").username, f"/failed/{record.pk}/")
    page.get_by_role("link", name="Task result").click()
    page.wait_for_url(f"{live_server.url}/tasks/{result.id}/")
    expect(page.locator("[data-task-status]")).to_have_text("FAILED")
    expect(page.locator("[data-task-attempts]")).to_have_text("2 (2 failed)")
    errors = page.locator("[data-task-error]")
    expect(errors).to_have_count(2)
    # The newest error is open; the first attempt's traceback opens on a click.
    expect(errors.nth(0).locator("pre")).to_be_visible()
    expect(errors.nth(0)).to_contain_text("builtins.ValueError")
    expect(errors.nth(0).locator("pre")).to_contain_text("browser fails on attempt 2")
    expect(errors.nth(1).locator("pre")).to_be_hidden()
    errors.nth(1).locator("summary").click()
    expect(errors.nth(1).locator("pre")).to_contain_text("browser fails on attempt 1")
    assert page.evaluate("window.__csp") == []
    # And back to the failed-message page.
    page.locator("[data-task-failed] a").click()
    page.wait_for_url(f"{live_server.url}/failed/{record.pk}/")
    expect(page.get_by_role("link", name="Task result")).to_be_visible()
    assert net.failures == []
