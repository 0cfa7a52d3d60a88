"""Shared pieces of the browser tests (tests/test_browser_*.py): Debian's Chromium under
Playwright, logging in through the real form, a network log that catches 4xx/5xx answers,
and a Celery worker (private Redis) that runs the bulk operations the pages start.

Setup (see /work/shared/STACK-NOTES.md, "Browser tests"): ``apt-get install -y chromium``
and ``pip install playwright pytest-playwright``; never ``playwright install``."""
from __future__ import annotations

import os

# Playwright's sync API runs an event loop in the test thread; without this Django's ORM
# refuses to run there (SynchronousOnlyOperation).  Set before any fixture touches the database.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

import pytest  # noqa: E402

from tests.dashboard_pages_support import PASSWORD  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
#: Marks for every browser test module.
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}"),
]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Debian's Chromium instead of Playwright's downloaded browsers."""
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"],
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    """1280 px wide: the width the dashboard is made for."""
    return {**browser_context_args, "viewport": {"width": 1280, "height": 900}}


class NetworkLog:
    """Every answer the page got with status >= 400 (requests the browser made itself)."""

    def __init__(self, page) -> None:
        self.failures: list[str] = []
        page.on("response", lambda r: self.failures.append(f"{r.status} {r.request.method} {r.url}")
                if r.status >= 400 else None)
        # A navigation cancels the requests in flight (a poll): ERR_ABORTED is no failure.
        page.on("requestfailed", lambda r: self.failures.append(f"failed {r.method} {r.url}: {r.failure}")
                if "ERR_ABORTED" not in (r.failure or "") else None)


def login(page, base_url: str, username: str, path: str = "/") -> None:
    """Log in through the login form (the way a person does), landing on ``path``."""
    page.goto(f"{base_url}{path}")
    assert "/accounts/login/" in page.url
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}{path}")


@pytest.fixture(scope="module")
def celery_worker(django_db_setup, django_db_blocker, tmp_path_factory):
    """One task-only Celery worker on a private Redis, against the test database; it runs the
    bulk operations the pages start (sluice.run_bulk_operation).  Yields the cluster."""
    from tests.celery_support import CeleryCluster, RedisServer

    redis = RedisServer().start()
    cluster = CeleryCluster(redis, tmp_path_factory.mktemp("celery"),
                            env={"SLUICE_CELERY_HOST_LOOPS": "0", "SLUICE_RETRY_BATCH_SIZE": "10"})
    try:
        with django_db_blocker.unblock():
            cluster.worker()
        yield cluster
    finally:
        cluster.stop_all()
        redis.stop()


@pytest.fixture
def worker_broker(celery_worker, settings):
    """Point the dashboard's task producer at the worker's Redis for this test."""
    settings.REDIS_URL = celery_worker.redis.url
    return celery_worker
