"""How fast the dashboard answers with a lot of data.

    python -m benchmarks dashboard --db sqlite|postgresql [--messages N] [--queues Q] [--failed F]
                                   [--groups G] [--outbox O] [--requests R] [--target pages|api]

Fills Q queues (default 100) with N messages in all (default 1,000,000), F failed-message
records (default 1,000,000; in G groups, default 100,000; 80 % unresolved) and O outbox
records (default 1,000,000; 1 % undispatched) with bulk statements (not timed), then times,
through Django's test client as a logged-in operator, R requests each (default 40, after 2
warm-ups) of:

- ``overview``: ``/`` (pages) or ``/api/queues/`` (api) — the cached statistics snapshot;
- ``queue``: one queue's first page of messages;
- ``message``: one message's page (its body) / the API's listing with bodies;
- ``groups``: the failed-message groups;
- ``search``: a text search over failed messages;
- ``failed_detail``: one failed message;
- ``delayed``, ``outbox``, ``audit``: those pages.

Also measured: one uncached statistics snapshot (``snapshot_uncached_ms``, what a refresh
costs once per SLUICE_DASHBOARD_CACHE_SECONDS), one uncached groups request
(``groups_uncached_ms``), both after the process has made one of each as a running server
has (``snapshot_first_in_process_ms``, ``groups_first_in_process_ms``: those also import
the cache's Redis client and the failed pages' views and compile their templates), and the
API endpoints when timing pages.
``monitoring_ms_p95`` and more: the monitoring tab over ``--monitoring-records`` processing
records (default 10,000,000; benchmarks/monitoring.py).  ``alerts_eval_ms_p95``: one evaluation of 50 alert rules over the Q queues (core.alerts),
on the same data.  Result: ``<page>_ms_p95`` / ``<page>_ms_p50`` for each,
``api_<page>_ms_p95``, ``messages``, ``failed``, ``groups``, ``outbox`` and more.  Aim: every
p95 under 150 ms.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
import uuid
from typing import Any, Callable

from benchmarks import common, monitoring
from benchmarks.common import (
    BenchmarkError, Progress, add_database_argument, database_version, log, positive_int, standard_main,
    setup_django,
)

HELP = ("dashboard and JSON API response times with 1,000,000 messages, 1,000,000 failed messages "
        "in 100,000 groups and 1,000,000 outbox records")
DATABASE_NAME = "sluice_bench_dashboard"
GROUPS = 100_000
TYPES = ("Orders.PlaceOrder", "Billing.ChargeCard", "Shipping.ShipOrder", "Mail.SendReceipt")
EXCEPTIONS = ("TimeoutError", "ValueError", "KeyError", "ConnectionResetError", "PermissionError")
SEARCH_TEXT = "customer 4711"
INSERT_BATCH = 5000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument("--messages", type=positive_int, default=1_000_000, metavar="N",
                        help="messages in all queues together (default 1,000,000)")
    parser.add_argument("--queues", type=positive_int, default=100, metavar="Q", help="queues (default 100)")
    parser.add_argument("--failed", type=positive_int, default=1_000_000, metavar="F",
                        help="failed-message records (default 1,000,000)")
    parser.add_argument("--groups", type=positive_int, default=GROUPS, metavar="G",
                        help=f"failure groups they fall in (default {GROUPS:,})")
    parser.add_argument("--outbox", type=int, default=1_000_000, metavar="O",
                        help="outbox records (default 1,000,000; 0: no outbox table)")
    parser.add_argument("--requests", type=positive_int, default=40, metavar="R",
                        help="timed requests per page (default 40)")
    parser.add_argument("--target", choices=("pages", "api"), default="pages",
                        help="time the HTML pages (default) or the JSON API")
    parser.add_argument("--db-name", default=DATABASE_NAME, metavar="NAME",
                        help=f"the PostgreSQL database to create and drop (default {DATABASE_NAME}; "
                             "give another to run two at once)")
    monitoring.add_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    return standard_main("dashboard", HELP, add_arguments, run, argv)


# -- filling ----------------------------------------------------------------------------------

def fill_queues(queues: int, messages: int) -> list[str]:
    """``queues`` queues with ``messages`` rows in all, by executemany of the dialect's INSERT
    (one round trip per batch on PostgreSQL); 5 % of them already expired."""
    from django.db import connection, transaction

    from core.messages import Headers, encode_headers, wire_time
    from core.queues import create_queue, dialect

    names = [f"bench_q{i:03d}" for i in range(queues)]
    for name in names:
        create_queue(name)
    d = dialect()
    now = dt.datetime.now(dt.timezone.utc)
    past, future = d.datetime_param(now - dt.timedelta(hours=1)), d.datetime_param(now + dt.timedelta(days=7))
    progress = Progress("filling queues", messages)
    done = 0
    per_queue = [messages // queues + (1 if i < messages % queues else 0) for i in range(queues)]
    for name, count in zip(names, per_queue):
        sql = d.insert_with_expires(name)
        for start in range(0, count, INSERT_BATCH):
            rows = []
            for i in range(start, min(start + INSERT_BATCH, count)):
                mid = str(uuid.uuid4())
                headers = encode_headers({Headers.MESSAGE_ID: mid, Headers.ENCLOSED_MESSAGE_TYPES: TYPES[i % 4],
                                          Headers.TIME_SENT: wire_time(now - dt.timedelta(seconds=count - i)),
                                          Headers.CONTENT_TYPE: "application/json"})
                rows.append([mid, mid, None, past if i % 20 == 0 else future, headers,
                             json.dumps({"order": i, "queue": name}).encode()])
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.executemany(sql, rows)
            done += len(rows)
            progress.update(done)
    progress.done()
    return names


def fill_failed(count: int, queues: list[str], group_count: int = GROUPS) -> None:
    """``count`` failed-message records in ``group_count`` groups, by bulk_create."""
    from core.failures import group_of
    from core.messages import Headers, encode_headers
    from core.models import FailedMessage, FailureStatus

    now = dt.datetime.now(dt.timezone.utc)
    groups = []
    for g in range(group_count):
        exc = EXCEPTIONS[g % len(EXCEPTIONS)]
        trace = f'Traceback (most recent call last):\n  File "app/handlers{g}.py", line 10, in handle_{g}\n{exc}: x'
        groups.append((exc, trace, *group_of(exc, trace)))
    progress = Progress("filling failed messages", count)
    batch: list[FailedMessage] = []
    for i in range(count):
        exc, trace, key, title = groups[(i * 7919) % group_count]
        when = now - dt.timedelta(minutes=i)
        status = FailureStatus.UNRESOLVED if i % 10 < 8 else (
            FailureStatus.ARCHIVED if i % 10 == 8 else FailureStatus.RESOLVED)
        mid = str(uuid.uuid4())
        queue = queues[i % len(queues)]
        customer = f"customer {i % 5000}"
        batch.append(FailedMessage(
            message_id=mid, original_queue=queue, message_type=TYPES[i % 4], exception_type=exc,
            exception_message=f"could not process order {i} for {customer}", stack_trace=trace, group_key=key,
            group_title=title, time_of_failure=when, attempts=6, status=status,
            headers=encode_headers({Headers.MESSAGE_ID: mid, Headers.FAILED_Q: queue}),
            body=json.dumps({"order": i}).encode(), first_failed_at=when, last_failed_at=when,
            archived_at=when if status == FailureStatus.ARCHIVED else None,
            resolved_at=when if status == FailureStatus.RESOLVED else None,
            history=[{"at": when.isoformat(), "event": "failed", "exception_type": exc}]))
        if len(batch) == 2000:
            FailedMessage.objects.bulk_create(batch)
            batch = []
            progress.update(i + 1)
    if batch:
        FailedMessage.objects.bulk_create(batch)
    progress.update(count)
    progress.done()


def fill_outbox(count: int) -> None:
    """``count`` outbox records (1 % undispatched, a few quarantined) by executemany of the
    dialect's INSERT, then marked dispatched in one UPDATE."""
    from django.db import connection, transaction

    from core.outbox import OutboxStore, create_outbox_table
    from core.outbox.store import PERSISTENCE_VERSION

    if not count:
        return
    create_outbox_table()
    store = OutboxStore()
    d = store.dialect
    operations = json.dumps([{"destination": "bench_q000", "body": "{}"}])
    progress = Progress("filling the outbox", count)
    for start in range(0, count, INSERT_BATCH):
        rows = [[f"outbox-{i:07d}", PERSISTENCE_VERSION, operations] for i in range(start, min(start + INSERT_BATCH, count))]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(d.outbox_insert(store.table, False), rows)
        progress.update(start + len(rows))
    progress.done()
    table, c = d.table(store.table), d._col
    with transaction.atomic(), connection.cursor() as cursor:
        # 99 % dispatched (what a running dispatcher leaves), 1 % waiting, 0.01 % quarantined.
        cursor.execute(f"UPDATE {table} SET {d._is('Dispatched', True)} WHERE {c('MessageId')} NOT LIKE %s",
                       ["outbox-%00"])
        cursor.execute(f"UPDATE {table} SET {d._is('Quarantined', True)} WHERE {c('MessageId')} LIKE %s",
                       ["outbox-%0000"])


def analyse() -> None:
    """Visibility map and planner statistics fresh, as autovacuum leaves them after a bulk
    load (VACUUM and ANALYZE mean the same on SQLite and PostgreSQL)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM")
        cursor.execute("ANALYZE")


# -- timing --------------------------------------------------------------------------------------

def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def time_get(client, url: str, requests: int) -> dict[str, float]:
    for _ in range(2):
        response = client.get(url)
        if response.status_code != 200:
            raise BenchmarkError(f"GET {url} answered {response.status_code}: {response.content[:300]!r}")
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        if response.status_code != 200:
            raise BenchmarkError(f"GET {url} answered {response.status_code}")
    return {"p50": statistics.median(samples), "p95": p95(samples), "max": max(samples)}


def timed(label: str, fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    ms = (time.perf_counter() - started) * 1000
    log(f"{label}: {ms:.1f} ms")
    return ms


def urls(target: str, queue: str, row_version: int, failed_pk: int) -> dict[str, str]:
    search = SEARCH_TEXT.replace(" ", "+")
    if target == "api":
        return {"overview": "/api/queues/", "queue": f"/api/queues/{queue}/messages/?limit=50",
                "message": f"/api/queues/{queue}/messages/?limit=50&bodies=1",
                "groups": "/api/failed/groups/", "search": f"/api/failed/?q={search}&limit=50",
                "failed_detail": f"/api/failed/{failed_pk}/", "delayed": "/api/delayed/",
                "outbox": "/api/outbox/", "audit": "/api/audit/"}
    return {"overview": "/", "queue": f"/queues/{queue}/", "message": f"/queues/{queue}/messages/{row_version}/",
            "groups": "/failed/", "search": f"/failed/?q={search}&status=all",
            "failed_detail": f"/failed/{failed_pk}/", "delayed": "/delayed/", "outbox": "/outbox/",
            "audit": "/audit/"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.messages < args.queues:
        raise BenchmarkError("--messages must be at least --queues")
    with common.bench_database(args.db, args.db_name) as url:
        setup_django(url)
        from django.contrib.auth.models import User
        from django.test import Client
        from django.test.utils import setup_test_environment

        from dashboard.counting import stats

        from django.conf import settings
        from django.test.utils import override_settings

        setup_test_environment()  # ALLOWED_HOSTS for the test client
        # Plain static names: no collectstatic manifest is needed to render the pages.
        override_settings(STORAGES={**settings.STORAGES, "staticfiles": {
            "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}).enable()
        queues = fill_queues(args.queues, args.messages)
        fill_failed(args.failed, queues, args.groups)
        fill_outbox(args.outbox)
        monitoring.fill(args.monitoring_records, queues)
        analyse()
        stats.clear_cache()
        operator = User.objects.create_superuser("bench", password=None)
        client = Client()
        client.force_login(operator)
        # What sluice/wsgi.py does before a server process serves (core.startup.settle_heap):
        # without it this process's full collections, not the pages, set the p95.
        from django.urls import get_resolver

        from core.startup import settle_heap

        get_resolver().url_patterns  # noqa: B018 — loaded for its side effect, as in sluice/wsgi.py
        settle_heap()
        # The first snapshot and groups page of this process also import the cache's Redis
        # client and the failed pages' views and compile their templates, once per process;
        # the "uncached" keys are what a running server pays again once per cache period.
        first_snapshot_ms = timed("statistics snapshot, first in this process", lambda: stats.snapshot(max_age=0))
        snapshot_ms = timed("statistics snapshot, uncached", lambda: stats.snapshot(max_age=0))
        result: dict[str, Any] = {"db": args.db, "db_version": database_version(), "target": args.target,
                                  "messages": args.messages, "queues": args.queues, "failed": args.failed,
                                  "groups": args.groups, "outbox": args.outbox,
                                  "requests": args.requests, "snapshot_uncached_ms": snapshot_ms,
                                  "snapshot_first_in_process_ms": first_snapshot_ms}
        from core.models import FailedMessage
        from core.transport import Transport

        queue = queues[len(queues) // 2]
        row_version = Transport().browse_sizes(queue, limit=1)[0][0].row_version
        failed_pk = FailedMessage.objects.order_by("-pk").values_list("pk", flat=True)[0]
        result["groups_first_in_process_ms"] = timed("failed groups page, first in this process",
                                                     lambda: client.get("/failed/"))
        stats.clear_cache()
        result["groups_uncached_ms"] = timed("failed groups page, uncached", lambda: client.get("/failed/"))
        for name, path in urls(args.target, queue, row_version, failed_pk).items():
            timing = time_get(client, path, args.requests)
            log(f"{name} {path}: p50 {timing['p50']:.1f} ms, p95 {timing['p95']:.1f} ms, max {timing['max']:.1f} ms")
            result[f"{name}_ms_p95"] = timing["p95"]
            result[f"{name}_ms_p50"] = timing["p50"]
        if args.monitoring_records > 0:  # the monitoring tab (benchmarks/monitoring.py)
            result.update(monitoring.measure(client, queue, args.requests, time_get), monitoring_records=args.monitoring_records)
        result["alerts_eval_ms_p95"] = alerts_eval_p95(queues, args.requests)
        if args.target == "pages":
            for name, path in urls("api", queue, row_version, failed_pk).items():
                timing = time_get(client, path, args.requests)
                log(f"api {name} {path}: p95 {timing['p95']:.1f} ms")
                result[f"api_{name}_ms_p95"] = timing["p95"]
        return result


def alerts_eval_p95(queues: list[str], evaluations: int) -> float:
    """p95 of one evaluation of 50 alert rules over every queue: queue-length rules per group
    of ten queues (half of them firing: 50 alerts), oldest-age, stalled-queue and failed-group
    rules (with content filters), and every health rule.  The first evaluation (which creates
    the alerts) is not timed."""
    from core.alerts.evaluator import evaluate
    from core.models.alerts import AlertRule, AlertTarget, RuleKind

    AlertTarget.objects.create(name="bench", url="http://127.0.0.1:9/bench", max_per_hour=0)
    groups = sorted({name[:-1] + "*" for name in queues})[:10]
    rules = []
    for i, pattern in enumerate(groups):
        rules.append(AlertRule(name=f"length {pattern}", kind=RuleKind.QUEUE_LENGTH, threshold=1 if i % 2 else 10**9,
                               filters={"queue": pattern}))
        rules.append(AlertRule(name=f"age {pattern}", kind=RuleKind.OLDEST_AGE, threshold=10**9,
                               filters={"queue": pattern}))
        rules.append(AlertRule(name=f"stalled {pattern}", kind=RuleKind.STALLED_QUEUE, window_seconds=300,
                               filters={"queue": pattern}))
    for i in range(10):
        filters = [{}, {"exception_type": EXCEPTIONS[i % len(EXCEPTIONS)]}, {"message_type": TYPES[i % len(TYPES)]},
                   {"queue": queues[i % len(queues)]}][i % 4]
        rules.append(AlertRule(name=f"failed {i}", kind=RuleKind.FAILED_GROUP, threshold=10 + i, window_seconds=3600,
                               filters=filters))
    health = [RuleKind.BREAKER_OPEN, RuleKind.HEARTBEAT_LOST, RuleKind.DATABASE_DOWN, RuleKind.REDIS_DOWN,
              RuleKind.OUTBOX_BACKLOG, RuleKind.OUTBOX_AGE, RuleKind.DELAYED_NOT_MOVED,
              RuleKind.RECORDS_NOT_EXPORTED, RuleKind.DELIVERY_FAILED, RuleKind.BREAKER_OPEN]
    rules += [AlertRule(name=f"health {i} {kind}", kind=kind, threshold=600, window_seconds=600)
              for i, kind in enumerate(health)]
    AlertRule.objects.bulk_create(rules[:50])
    first = evaluate()
    log(f"alerts: {first.rules} rules, first evaluation {first.ms:.1f} ms, {first.notifications} notified, "
        f"errors {first.errors or 'none'}")
    samples = [evaluate().ms for _ in range(evaluations)]
    log(f"alerts evaluation: p50 {statistics.median(samples):.1f} ms, p95 {p95(samples):.1f} ms")
    return p95(samples)
