"""The live monitoring tab (/monitoring/, /api/monitoring/): figures from processing records a
real pump wrote, queue lengths a real sampler wrote, the pipeline's windows for older times,
failed counts, worker flags from real Redis heartbeats, deploy markers from `sluice mark-deploy`."""
from __future__ import annotations

import datetime as dt
import io
import json

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.monitoring import live as monitoring
from core.runtime.health import KEY_PREFIX
from core.runtime.lease import Lease
from core.models.monitoring import QueueHour, QueueMinute, QueueSample, RollupMark, grain_of
from core.db import database_now_us
from core.monitoring.queue_samples import QueueSampler, delete_old_minutes, delete_old_samples, roll_up_hours, roll_up_minutes
from core.models.records import MetricWindow, ProcessingRecord
from dashboard.models import AuditEntry, DeployMarker
from tests.dashboard_pages_support import (  # noqa: F401 — fixtures
    _fresh_dashboard_cache, make_user, viewer, viewer_client,
)
from tests.monitoring_support import busy_queue  # noqa: F401 — a fixture

US = 1_000_000


def test_the_tab_shows_each_queue_with_sparklines_failed_badge_and_length(viewer_client, busy_queue):
    response = viewer_client.get("/monitoring/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-queue="{busy_queue}"' in html
    assert html.count('class="spark"') >= 5  # throughput, retries, processing, critical, length
    assert f'href="/failed/?queue={busy_queue}" data-role="failed-badge"' in html and "1 failed" in html
    assert 'hx-trigger="every 10s"' in html and "data-poll-visible-only" in html  # 5 m: 10 s buckets

    figures = viewer_client.get("/api/monitoring/").json()
    q = next(x for x in figures["queues"] if x["queue"] == busy_queue)
    # 5 processed + 3 processed + (1 retried, 1 failed) = 10 records, every one in the period.
    assert (q["records"], q["retried"], q["failed_unresolved"], q["length"]) == (10, 1, 1, 1)
    assert q["failures"] == 2 and q["skewed"] == 0
    assert len(q["buckets"]) == monitoring.BUCKETS and sum(b["records"] for b in q["buckets"]) == 10
    # Averages over every record: 10 attempts whose handler ran, 8 processed (critical time).
    records = ProcessingRecord.objects.filter(queue=busy_queue)
    assert q["processing_avg_ms"] == pytest.approx(sum(r.ended_us - r.started_us for r in records) / 10 / 1000)
    processed = [r for r in records if r.outcome == "processed"]
    assert q["critical_avg_ms"] == pytest.approx(sum(r.ended_us - r.time_sent_us for r in processed) / 8 / 1000)
    assert q["sampled"] == 0 and q["processing_ms"]["p50"] is None  # percentiles: the queue's own page
    detail = viewer_client.get(f"/api/monitoring/{busy_queue}/").json()["queue"]
    assert detail["sampled"] == 10 and detail["critical_ms"]["p99"] >= detail["critical_ms"]["p50"] > 0
    assert figures["period"]["name"] == "5m" and figures["period"]["bucket_seconds"] == 10


@pytest.mark.parametrize("period, bucket, refresh", [("1m", 2, 5), ("5m", 10, 10), ("15m", 30, 30), ("1h", 120, 120)])
def test_each_period_has_its_buckets_and_refresh(viewer_client, busy_queue, period, bucket, refresh):
    figures = viewer_client.get(f"/api/monitoring/?period={period}").json()
    assert (figures["period"]["bucket_seconds"], figures["period"]["refresh_seconds"]) == (bucket, refresh)
    assert next(x for x in figures["queues"] if x["queue"] == busy_queue)["records"] == 10
    html = viewer_client.get(f"/monitoring/?period={period}").content.decode()
    assert f'hx-trigger="every {refresh}s"' in html and f'data-period="{period}" aria-current="true"' in html


def test_a_past_range_does_not_refresh_and_bad_input_gets_a_clear_error(viewer_client, busy_queue):
    start = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    end = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    response = viewer_client.get(f"/monitoring/?period=range&from={start}&to={end}")
    assert response.status_code == 200 and "hx-trigger" not in response.content.decode()
    figures = viewer_client.get(f"/api/monitoring/?period=range&from={start}&to={end}").json()
    assert figures["period"]["live"] is False and figures["period"]["bucket_seconds"] == 120
    assert next(x for x in figures["queues"] if x["queue"] == busy_queue)["records"] == 0
    for query, reason in [("period=2d", "period must be one of"), ("period=range&from=yesterday", "ISO 8601")]:
        page = viewer_client.get(f"/monitoring/?{query}")
        assert page.status_code == 400 and reason in page.content.decode(), query
        api = viewer_client.get(f"/api/monitoring/?{query}")
        assert api.status_code == 400 and reason in api.json()["error"], query
    # A range that does not fit is made to fit, and the page says how.
    for query, note in [(f"from={end}&to={start}", "from and to swapped"), ("from=2020-01-01T00:00&to=2020-03-01T00:00",
                        "shortened to the last 31 days of it"), ("from=2999-01-01T00:00", "ends now"),
                        ("", "")]:
        period = viewer_client.get(f"/api/monitoring/?period=range&{query}").json()["period"]
        assert note in period["note"] and bool(period["note"]) == bool(note), query
        assert (f"Range {period['note']}" in viewer_client.get(f"/monitoring/?period=range&{query}").content.decode()) == bool(note)


def test_drill_down_by_message_type_and_worker(viewer_client, busy_queue):
    response = viewer_client.get(f"/monitoring/{busy_queue}/?period=15m")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="chart"') == 4 and 'data-key="PlaceOrder"' in html and 'data-key="ShipOrder"' in html
    worker = ProcessingRecord.objects.filter(queue=busy_queue).values_list("worker", flat=True).first()
    assert worker and f'data-key="{worker}"' in html
    detail = viewer_client.get(f"/api/monitoring/{busy_queue}/?period=15m").json()
    types = {s["key"]: (s["records"], s["retried"], s["failures"]) for s in detail["message_types"]}
    assert types == {"PlaceOrder": (7, 1, 2), "ShipOrder": (3, 0, 0)}
    assert [(s["key"], s["records"]) for s in detail["workers"]] == [(worker, 10)]
    assert detail["queue"]["failed_unresolved"] == 1
    assert viewer_client.get("/monitoring/no_such_queue/").status_code == 404
    assert viewer_client.get("/api/monitoring/no_such_queue/").json()["error"] == "unknown queue 'no_such_queue'"


def test_records_that_ended_before_they_were_sent_are_flagged_as_clock_skew(viewer_client, busy_queue):
    now = database_now_us()
    ProcessingRecord.objects.create(message_id="skewed", message_type="PlaceOrder", queue=busy_queue, endpoint="e",
                                    time_sent_us=now + 5 * US, started_us=now - 1000, ended_us=now,
                                    outcome="processed", worker="elsewhere:1")
    q = next(x for x in viewer_client.get("/api/monitoring/").json()["queues"] if x["queue"] == busy_queue)
    assert q["skewed"] == 1 and q["critical_avg_ms"] >= 0  # left out of the critical time, not negative
    detail = viewer_client.get(f"/api/monitoring/{busy_queue}/").json()["queue"]
    assert detail["skewed"] == 1 and detail["critical_ms"]["p50"] >= 0
    assert 'data-flag="records-skew"' in viewer_client.get("/monitoring/").content.decode()
    by_worker = viewer_client.get(f"/api/monitoring/{busy_queue}/").json()["workers"]
    assert next(s for s in by_worker if s["key"] == "elsewhere:1")["skewed"] == 1


def test_older_times_come_from_the_pipeline_windows_without_a_seam(viewer_client, busy_queue):
    """Records before the queue's oldest kept one are gone (exported, deleted): the range's
    earlier buckets come from the hourly windows, the later ones from the records."""
    now = database_now_us()
    hour = now // (3600 * US) * 3600 * US
    ProcessingRecord.objects.filter(queue=busy_queue).update(ended_us=hour + 60 * US)  # the hour now lies in
    for h in (1, 2):
        MetricWindow.objects.create(
            queue=busy_queue, message_type="PlaceOrder", window_seconds=3600, messages=100 * h,
            window_start=monitoring.when(hour - h * 3600 * US), throughput_per_s=100 * h / 3600, retries=h,
            failures=h, failure_rate=h / 100, processing_ms_p50=5.0, processing_ms_p95=9.0, processing_ms_p99=12.0,
            critical_ms_p50=50.0, critical_ms_p95=90.0, critical_ms_p99=120.0)
    start = monitoring.when(hour - 40 * 3600 * US).strftime("%Y-%m-%dT%H:%M")
    q = next(x for x in viewer_client.get(f"/api/monitoring/?period=range&from={start}").json()["queues"]
             if x["queue"] == busy_queue)
    from_windows = [b for b in q["buckets"] if b["from_windows"]]
    # 2-hour points: the records' hour may share its point with the newer window's hour.
    assert sum(b["records"] for b in from_windows) in (300, 310) and q["records"] == 310 and q["retried"] == 1 + 3
    assert from_windows[0]["processing_ms"]["p95"] == 9.0 and from_windows[0]["processing_avg_ms"] == 5.0
    detail = viewer_client.get(f"/monitoring/{busy_queue}/?period=range&from={start}")
    assert detail.status_code == 200 and detail.content.decode().count("<polyline") >= 3  # the windows' hours


def test_a_range_reads_its_windows_once_until_the_pipeline_loads_a_run(viewer_client, busy_queue):
    """The windows' rows of a range are kept for a minute per process, keyed by the windows'
    ids: a load (which replaces windows) is seen at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from core.records.results import load_results

    now = database_now_us()
    hour = now // (3600 * US) * 3600 * US
    ProcessingRecord.objects.filter(queue=busy_queue).update(ended_us=hour + 60 * US)
    row = dict(queue=busy_queue, message_type="PlaceOrder", window_seconds=3600, messages=100,
               window_start=monitoring.when(hour - 3600 * US), throughput_per_s=100 / 3600, retries=1, failures=1,
               failure_rate=0.01, processing_ms_p50=5.0, processing_ms_p95=9.0, processing_ms_p99=12.0,
               critical_ms_p50=50.0, critical_ms_p95=90.0, critical_ms_p99=120.0)
    MetricWindow.objects.create(**row)
    url = f"/api/monitoring/?period=range&from={monitoring.when(hour - 40 * 3600 * US).strftime('%Y-%m-%dT%H:%M')}"

    def windowed() -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            q = next(x for x in viewer_client.get(url).json()["queues"] if x["queue"] == busy_queue)
        summed = sum(1 for x in queries if "sluice_metric_window" in x["sql"] and "GROUP BY" in x["sql"])
        return sum(b["records"] for b in q["buckets"] if b["from_windows"]), summed

    # (The records' hour may share its point with the window's: 10 more records there.)
    first, summed = windowed()
    assert first in (100, 110) and summed == 1
    assert windowed() == (first, 0)  # the same windows: not read again
    load_results([{**row, "messages": 250, "expired": 0, "dead_lettered": 0}])  # the next run replaces the hour
    assert windowed() == (first + 150, 1)


def test_the_sampler_writes_one_length_per_queue_one_writer_at_a_time(busy_queue):
    QueueSample.objects.all().delete()
    first, second = QueueSampler(interval=60), QueueSampler(interval=60)
    try:
        assert first.step() > 50 and first.written >= 1 and QueueSample.objects.get(queue=busy_queue).grain == 3
        assert second.step() <= 5 and second.written == 0  # the lease is held: it stands by
        sample = QueueSample.objects.get(queue=busy_queue)
        assert sample.length == 1 and abs(sample.at_us - database_now_us()) < 5 * US
    finally:
        first.close()
        second.close()
    QueueSample.objects.create(queue=busy_queue, at_us=database_now_us() - 3 * 24 * 3600 * US, length=7)
    assert delete_old_samples(2 * 24 * 3600) == 1 and QueueSample.objects.filter(queue=busy_queue).count() == 1
    assert Lease("queue-sampler", 30, "default").acquire()  # closed samplers released it: anyone may take it


@pytest.fixture
def heartbeats():
    """Heartbeats written into the test's Redis the way workers write them (core.runtime.health)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    written = []

    def beat(name: str, seconds_ago: float, loops: list | None = None) -> None:
        seen = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=seconds_ago)
        client.set(KEY_PREFIX + name, json.dumps({"name": name, "last_seen": seen.isoformat(),
                                                        "loops": loops or [], "breakers": []}), ex=30)
        written.append(KEY_PREFIX + name)

    yield beat
    if written:
        client.delete(*written)


def test_stale_workers_and_clocks_that_disagree_are_flagged(viewer_client, busy_queue, heartbeats):
    heartbeats("mon-ok:1", 0.5)
    heartbeats("mon-stale:2", 10)
    heartbeats("mon-ahead:3", -30)
    heartbeats("mon-behind:4", 60)
    heartbeats("mon-loop:5", 0.5, [{"name": "pump:orders", "alive": False}])
    workers = {w["name"]: w for w in viewer_client.get("/api/monitoring/").json()["workers"]["workers"]}
    assert not workers["mon-ok:1"]["stale"] and workers["mon-ok:1"]["clock_skew"] == ""
    assert workers["mon-stale:2"]["stale"] and workers["mon-stale:2"]["clock_skew"] == ""
    assert "ahead" in workers["mon-ahead:3"]["clock_skew"] and not workers["mon-ahead:3"]["stale"]
    assert "behind" in workers["mon-behind:4"]["clock_skew"]
    assert workers["mon-loop:5"]["dead_loops"] == ["pump:orders"]
    html = viewer_client.get("/monitoring/").content.decode()
    assert 'data-worker="mon-stale:2"' in html and 'data-flag="stale"' in html and 'data-flag="clock-skew"' in html


def test_mark_deploy_is_audited_and_drawn_on_every_chart(viewer_client, busy_queue):
    out = io.StringIO()
    call_command("sluice", "mark-deploy", "v2.4.1", "--json", stdout=out)
    marker = json.loads(out.getvalue())
    assert marker["label"] == "v2.4.1" and marker["by"].endswith("(cli)")
    entry = AuditEntry.objects.get(action="mark_deploy")
    assert (entry.via, entry.target, entry.outcome, entry.target_ids) == ("cli", "deploy v2.4.1", "ok",
                                                                          [str(marker["id"])])
    html = viewer_client.get("/monitoring/").content.decode()
    row = html[html.index(f'data-queue="{busy_queue}"'):]
    row = row[:row.index("</tr>")]
    assert row.count('class="deploy"') == 5  # every sparkline of the queue
    detail = viewer_client.get(f"/monitoring/{busy_queue}/").content.decode()
    assert detail.count('class="deploy"') == 4 and "deploy v2.4.1" in detail
    assert [d["label"] for d in viewer_client.get("/api/monitoring/").json()["deploys"]] == ["v2.4.1"]
    with pytest.raises(CommandError, match="must not be empty"):
        call_command("sluice", "mark-deploy", "  ")
    assert DeployMarker.objects.count() == 1


def test_only_signed_in_users_with_a_role_see_it(client, busy_queue, transactional_db):
    assert client.get("/monitoring/").status_code == 302
    assert client.get("/api/monitoring/").status_code in (401, 403)
    client.force_login(make_user(None))
    assert client.get("/monitoring/").status_code == 403


def test_a_queue_filter_and_the_htmx_refresh_render_the_region_only(viewer_client, busy_queue, make_queue):
    other = make_queue("other")
    html = viewer_client.get(f"/monitoring/?q={busy_queue}").content.decode()
    assert f'data-queue="{busy_queue}"' in html and f'data-queue="{other}"' not in html
    region = viewer_client.get("/monitoring/?period=1m", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in region and 'id="monitoring-queues"' in region


def test_a_long_period_reads_only_the_coarse_samples(busy_queue):
    """Samples every 10 s for two hours: 5 minutes read all 30 of theirs, an hour (2-minute
    buckets) only the minutes' first, a day's range (48-minute buckets) the ten minutes' first."""
    QueueSample.objects.all().delete()
    now = database_now_us()
    previous = None
    for i in range(720, 0, -1):
        at = now - i * 10 * US
        QueueSample.objects.create(queue=busy_queue, at_us=at, length=i, grain=grain_of(at, previous))
        previous = at
    read = {name: len(monitoring.lengths_query([busy_queue], monitoring.make_period(name, now_us=now)))
            for name in ("5m", "1h")}
    assert 28 <= read["5m"] <= 31 and 57 <= read["1h"] <= 61
    day = monitoring.make_period("range", monitoring.when(now - 24 * 3600 * US), now_us=now)
    assert day.bucket_seconds == 2880 and 12 <= len(monitoring.lengths_query([busy_queue], day)) <= 13
    series = monitoring.queue_series([busy_queue], monitoring.make_period("1h", now_us=now))[busy_queue]
    assert series.length_last == 1 and sum(b.length is not None for b in series.buckets) >= 29


def test_minutes_rolled_up_give_the_same_figures_as_the_records(viewer_client, busy_queue):
    """An hour's points come from the minutes the sampler summed and the records after them:
    the figures are the same before and after the roll-up, nothing counted twice."""
    ten_minutes = 600 * US
    records = ProcessingRecord.objects.filter(queue=busy_queue)
    for r in records:  # handled ten minutes ago (the roll-up leaves the last two minutes to the records)
        ProcessingRecord.objects.filter(pk=r.pk).update(
            ended_us=r.ended_us - ten_minutes, started_us=r.started_us - ten_minutes,
            time_sent_us=r.time_sent_us - ten_minutes)

    def figures() -> dict:
        q = next(x for x in viewer_client.get("/api/monitoring/?period=1h").json()["queues"] if x["queue"] == busy_queue)
        return {k: q[k] for k in ("records", "retried", "failures", "skewed")} | {
            "processing": round(q["processing_avg_ms"], 6), "critical": round(q["critical_avg_ms"], 6),
            "per_bucket": [b["records"] for b in q["buckets"]]}

    before = figures()
    assert roll_up_minutes() >= 1 and roll_up_minutes() == 0  # the second finds nothing due
    minutes = QueueMinute.objects.filter(queue=busy_queue)
    assert sum(m.records for m in minutes) == 10 and sum(m.retried for m in minutes) == 1
    assert figures() == before and before["records"] == 10


def test_hours_rolled_up_give_the_same_figures_as_the_minutes_and_the_records(viewer_client, busy_queue):
    """A range of days (buckets of whole hours) reads the hours the sampler summed from its
    minutes, the minutes on either side and the records after them: the figures are the
    same from the records alone, after the minutes' roll-up and after the hours'."""
    three_hours = 3 * 3600 * US
    for r in ProcessingRecord.objects.filter(queue=busy_queue):  # handled three hours ago
        ProcessingRecord.objects.filter(pk=r.pk).update(
            ended_us=r.ended_us - three_hours, started_us=r.started_us - three_hours,
            time_sent_us=r.time_sent_us - three_hours)
    now = database_now_us()
    RollupMark.objects.create(name="queue-minutes", until_us=(now - 5 * 3600 * US) // (60 * US) * 60 * US)
    since = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")

    def figures() -> dict:
        body = viewer_client.get("/api/monitoring/", {"period": "range", "from": since}).json()
        assert body["period"]["bucket_seconds"] % 3600 == 0
        q = next(x for x in body["queues"] if x["queue"] == busy_queue)
        return {k: q[k] for k in ("records", "retried", "failures", "skewed")} | {
            "processing": round(q["processing_avg_ms"], 6), "critical": round(q["critical_avg_ms"], 6),
            "per_bucket": [b["records"] for b in q["buckets"]]}

    from_records = figures()
    for _ in range(6):  # an hour of minutes a call, from five hours ago
        roll_up_minutes()
    from_minutes = figures()
    assert roll_up_hours() >= 1 and roll_up_hours() == 0
    hours = QueueHour.objects.filter(queue=busy_queue)
    assert sum(h.records for h in hours) == 10 and sum(h.retried for h in hours) == 1
    assert all(h.hour_us % (3600 * US) == 0 for h in hours)
    with CaptureQueriesContext(connection) as ctx:
        from_hours = figures()
    assert any("sluice_queue_hour" in q["sql"] for q in ctx.captured_queries)
    assert from_records == from_minutes == from_hours and from_records["records"] == 10


def test_an_hour_is_rolled_up_once_its_minutes_are_and_old_hours_are_deleted(busy_queue):
    hour = 3600 * US
    now = database_now_us()
    assert roll_up_hours() == 0  # no minutes rolled up yet: nothing to sum
    RollupMark.objects.create(name="queue-minutes", until_us=now // hour * hour - 2 * hour)
    for ago in (3 * hour + 600 * US, 3 * hour + 1200 * US, 4 * hour + 600 * US):  # two in one hour, one before
        QueueMinute.objects.create(queue=busy_queue, minute_us=now // hour * hour - ago, records=5, retried=1,
                                   failures=0, processing_sum_us=50, processing_n=5, critical_sum_us=90, critical_n=5,
                                   skewed=0)
    assert roll_up_hours() == 2 and roll_up_hours() == 0
    assert sorted(QueueHour.objects.filter(queue=busy_queue).values_list("records", flat=True)) == [5, 10]
    assert delete_old_minutes(60) == 5 and not QueueHour.objects.exists()


def test_pools_without_loops_sample_from_beat(busy_queue, settings):
    from workers.celery import beat_schedule
    from workers.tasks import sample_queues

    settings.SLUICE_CELERY_HOST_LOOPS = False
    entry = beat_schedule()["sample-queues"]
    assert entry["task"] == "sluice.sample_queues" and entry["schedule"] == 10.0
    QueueSample.objects.all().delete()
    assert sample_queues()["written"] >= 1 and QueueSample.objects.filter(queue=busy_queue).exists()
    settings.SLUICE_CELERY_HOST_LOOPS = True
    assert "sample-queues" not in beat_schedule()
