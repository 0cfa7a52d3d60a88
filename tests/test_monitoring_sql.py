"""The monitoring tab's reads are index ranges, never a scan of the processing records: each
statement's PostgreSQL plan (EXPLAIN) over 60,000 records in 20 queues (and a quiet one),
with fresh planner statistics, reads a range of ended_us on an index, and the queue-length
samples a range of at_us.  Records are appended in time order, so for a busy queue the
planner may well prefer the ended_us index (its heap pages in order); for a quiet queue
beside busy ones it must take the (queue, ended_us) index, or it would read every queue's
records of the period to find a few."""
from __future__ import annotations

import pytest
from django.db import connection

from core.monitoring import live as monitoring
from core.monitoring.slices import breakdown_query
from core.db import database_now_us
from core.models.monitoring import QueueHour

pytestmark = pytest.mark.skipif("connection.vendor != 'postgresql'")

US = 1_000_000
QUEUES = [f"explain_q{i:02d}" for i in range(20)]
#: 30 records in 5 hours, beside 3,000 per busy queue.
QUIET = "explain_quiet"


@pytest.fixture
def records(transactional_db):
    now = database_now_us()
    with connection.cursor() as cursor:
        # 60,000 records over the last 6 hours, 3,000 per queue (filling only: not what is measured).
        cursor.execute(
            "INSERT INTO sluice_processing_record (message_id, message_type, queue, endpoint, time_sent_us, "
            "started_us, ended_us, outcome, attempt, worker) "
            "SELECT 'm' || g, 'Type' || (g %% 4), 'explain_q' || lpad((g %% 20)::text, 2, '0'), 'e', "
            "%s - g * 360000 - 5000, %s - g * 360000 - 2000, %s - g * 360000, "
            "CASE WHEN g %% 10 = 0 THEN 'retried' ELSE 'processed' END, 1, 'host:' || (g %% 3) "
            "FROM generate_series(1::bigint, 60000) AS g", [now, now, now])
        cursor.execute(
            "INSERT INTO sluice_processing_record (message_id, message_type, queue, endpoint, time_sent_us, "
            "started_us, ended_us, outcome, attempt, worker) "
            "SELECT 'q' || g, 'Type', %s, 'e', %s - g * 600000000 - 5000, %s - g * 600000000 - 2000, "
            "%s - g * 600000000, 'processed', 1, 'host:1' FROM generate_series(1::bigint, 30) AS g",
            [QUIET, now, now, now])
        cursor.execute(
            "INSERT INTO sluice_queue_sample (queue, at_us, length, estimated, grain) "
            "SELECT 'explain_q' || lpad((g %% 20)::text, 2, '0'), %s - g * 1000000, g %% 100, false, "
            "CASE WHEN g %% 3600 = 0 THEN 3 WHEN g %% 600 = 0 THEN 2 WHEN g %% 60 = 0 THEN 1 ELSE 0 END "
            "FROM generate_series(1::bigint, 40000) AS g", [now])
        cursor.execute("ANALYZE sluice_processing_record")
        cursor.execute("ANALYZE sluice_queue_sample")
    return now


def plan(queryset) -> str:
    return queryset.explain()


def assert_index_range(text: str, indexes: str | tuple[str, ...], table: str, column: str = "ended_us") -> None:
    """The plan reads ``table`` through one of ``indexes`` with a range on ``column``."""
    indexes = (indexes,) if isinstance(indexes, str) else indexes
    assert any(f"using {index} on {table}" in text or f"Bitmap Index Scan on {index}" in text for index in indexes), text
    assert f"Seq Scan on {table}" not in text and f"({column} >= " in text, text


#: Every queue at once: PostgreSQL may read the period on either index (both a range of it).
EITHER = ("sluice_prec_queue_ended", "sluice_prec_ended")


def test_counts_for_every_queue_are_index_ranges(records):
    for period in ("1m", "5m", "1h"):
        p = monitoring.make_period(period, now_us=records)
        assert_index_range(plan(monitoring.counts_query(QUEUES, p.start_us, p)), EITHER, "sluice_processing_record")
        assert_index_range(plan(monitoring.counts_query(QUEUES[:2], p.start_us, p)), EITHER,
                           "sluice_processing_record")


def test_the_newest_records_of_a_queue_are_read_backwards_on_an_index_and_stop_at_the_limit(records):
    p = monitoring.make_period("1h", now_us=records)
    busy = plan(monitoring.sample_query(QUEUES[3], p.start_us, p, monitoring.DETAIL_SAMPLE))
    assert_index_range(busy, EITHER, "sluice_processing_record")
    assert "Limit" in busy and "Sort" not in busy, busy  # the index's order: no sort of the period's rows
    quiet = plan(monitoring.sample_query(QUIET, p.start_us, p, monitoring.DETAIL_SAMPLE))
    assert_index_range(quiet, "sluice_prec_queue_ended", "sluice_processing_record")


def test_a_breakdown_the_lengths_and_the_minutes_are_index_ranges(records):
    p = monitoring.make_period("15m", now_us=records)
    assert_index_range(plan(breakdown_query(QUEUES[0], p)), EITHER, "sluice_processing_record")
    assert_index_range(plan(breakdown_query(QUIET, p)), "sluice_prec_queue_ended", "sluice_processing_record")
    for period in (p, monitoring.make_period("1h", now_us=records)):  # every sample; the minutes' first
        assert_index_range(plan(monitoring.lengths_query(QUEUES, period)),
                           ("sluice_qsample_queue_at", "sluice_qsample_at", "sluice_qsample_grain"),
                           "sluice_queue_sample", "at_us")

    with connection.cursor() as cursor:  # two days of minutes of the 20 queues (what the sampler leaves)
        cursor.execute(
            "INSERT INTO sluice_queue_minute (queue, minute_us, records, retried, failures, processing_sum_us, "
            "processing_n, critical_sum_us, critical_n, skewed) "
            "SELECT 'explain_q' || lpad((g %% 20)::text, 2, '0'), (%s / 60000000 - g / 20) * 60000000, "
            "10, 1, 0, 5000, 10, 9000, 9, 0 FROM generate_series(0::bigint, 57599) AS g", [records])
        cursor.execute("ANALYZE sluice_queue_minute")
    p = monitoring.make_period("1h", now_us=records)
    assert_index_range(plan(monitoring.minutes_query(QUEUES[:5], p.start_us, p.end_us, p)),
                       ("sluice_qminute_key", "sluice_qminute_at"), "sluice_queue_minute", "minute_us")

    with connection.cursor() as cursor:  # thirty days of hours of the 20 queues
        cursor.execute(
            "INSERT INTO sluice_queue_hour (queue, hour_us, records, retried, failures, processing_sum_us, "
            "processing_n, critical_sum_us, critical_n, skewed) "
            "SELECT 'explain_q' || lpad((g %% 20)::text, 2, '0'), (%s / 3600000000 - g / 20) * 3600000000, "
            "600, 60, 0, 300000, 600, 540000, 540, 0 FROM generate_series(0::bigint, 14399) AS g", [records])
        cursor.execute("ANALYZE sluice_queue_hour")
    day = monitoring.make_period("range", start=monitoring.when(records - 86400 * US),
                                 end=monitoring.when(records), now_us=records)
    assert_index_range(plan(monitoring.minutes_query(QUEUES[:5], day.start_us, day.end_us, day, QueueHour)),
                       ("sluice_qhour_key", "sluice_qhour_at"), "sluice_queue_hour", "hour_us")
