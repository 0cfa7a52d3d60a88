"""Every dashboard and API read runs with a statement timeout (SLUICE_DASHBOARD_STATEMENT_TIMEOUT).

A page that asks the database for something unaffordable (a search over millions of rows,
a lock a long purge holds) must answer with a message in seconds, not hold a gunicorn worker
and a database connection until the proxy gives up.  GET requests' statements are bounded by
the dialect, in autocommit (no transaction a caught error would abort) (core/dialects:
PostgreSQL statement_timeout, SQL Server LOCK_TIMEOUT, SQLite a progress handler); a statement
stopped so gives a 503 page / JSON error that says which limit was reached.  Writes (POST…)
are not bounded: their bulk work runs on the workers, and an action half-stopped would be
worse than a slow one.

The session setting is made just before a request's first statement and lifted after its
last, only when the request made one: a request that needs no database (a page from the
snapshot cache, an anonymous health check) costs no round trip for it (Dialect.bounded).
"""
from __future__ import annotations

import logging
from typing import Callable

from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.conf import get_settings
from core.dialects import dialect_for

from dashboard.pages import error_response
from dashboard.security.middleware import dashboard_path, is_api_request

log = logging.getLogger("sluice.dashboard")

READS = ("GET", "HEAD")
#: Paths below the dashboard's mount point left alone: static files and Django's admin where
#: the dashboard is mounted at the root, and metrics, which Prometheus scrapes every few
#: seconds: it answers from the snapshot cache (whose refresh runs capped queries), and a
#: SET/RESET pair per scrape would be two round trips for nothing.  A host project's own
#: pages (outside the mount point) are never bounded.
EXEMPT = ("static/", "admin/", "metrics")


class StatementTimeoutMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        seconds = get_settings().DASHBOARD_STATEMENT_TIMEOUT
        below = dashboard_path(request)
        if request.method not in READS or seconds <= 0 or below is None or below.startswith(EXEMPT):
            return self.get_response(request)
        alias = get_settings().DATABASE
        connection = connections[alias]
        dialect = dialect_for(connection)
        with dialect.bounded(connection, seconds):
            response = self.get_response(request)
        if isinstance(response, _Stopped):  # rendered now, without the bound
            return _timed_out(request, seconds)
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        """A view's statement stopped by the timeout: a 503 that says so (else Django's 500)."""
        alias = get_settings().DATABASE
        if not isinstance(exc, DatabaseError) or not dialect_for(connections[alias]).is_statement_timeout(exc):
            return None
        if connections[alias].in_atomic_block:
            transaction.set_rollback(True, using=alias)  # a view's own transaction: rolled back, not committed
        seconds = get_settings().DASHBOARD_STATEMENT_TIMEOUT
        log.warning("%s %s stopped: a query ran past %s s (SLUICE_DASHBOARD_STATEMENT_TIMEOUT)",
                    request.method, request.path, seconds)
        return _Stopped(status=503)


class _Stopped(HttpResponse):
    """Marks a request whose statement timed out; __call__ answers it once the transaction is gone."""


def _timed_out(request: HttpRequest, seconds: float) -> HttpResponse:
    message = (f"This view needed a database query that ran longer than {seconds:g} s "
               "(SLUICE_DASHBOARD_STATEMENT_TIMEOUT) and was stopped. Narrow the search or filter, "
               "or try again when the database is less busy.")
    if is_api_request(request):
        return JsonResponse({"error": message}, status=503)
    return error_response(request, message, 503)
