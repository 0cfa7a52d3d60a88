"""The worker's statements on the task results keep using the primary key as the result
table grows (PostgreSQL: pgqueuer-style plan guards).  A worker starts beside an empty or
small table; a statement prepared then would keep the plan made for that size (a
sequential scan) for every later chunk, until an ANALYZE."""
from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from core.models import TaskResultRecord
from core.tasks.results import read_results, write_successes

GROWN_TO = 200_000  # big enough that a plan made for its size uses the key


def sequential_scans_of_results() -> int:
    """Sequential scans of the result table so far in this transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = %s",
                       [TaskResultRecord._meta.db_table])
        return cursor.fetchone()[0]


def ready_rows(count: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    TaskResultRecord.objects.bulk_create(
        TaskResultRecord(id=rid, task_path="tests.task_funcs.add", backend="default", queue_name="default")
        for rid in ids)
    return ids


@pytest.mark.django_db
def test_a_chunks_result_read_and_update_use_the_key_after_the_table_grew():
    if connection.vendor != "postgresql":
        pytest.skip("plans of prepared statements: PostgreSQL")
    first = ready_rows(20, "early")
    for _ in range(8):  # past the runs after which a prepared statement keeps a generic plan
        read_results("default", first)
        write_successes("default", timezone.now(), timezone.now(), [(rid, '["w"]', None) for rid in first])
    with connection.cursor() as cursor:  # the table grows while the worker runs
        cursor.execute(f"INSERT INTO {TaskResultRecord._meta.db_table} "
                       "(id, task_path, backend, queue_name, priority, args_kwargs, status, errors, worker_ids) "
                       "SELECT 'grown-' || n, 't', 'default', 'default', 0, '{}', 'READY', '[]', '[]' "
                       "FROM generate_series(1, %s) AS n", [GROWN_TO])
    chunk = [f"grown-{n}" for n in range(1, 101)]
    before = sequential_scans_of_results()
    rows = read_results("default", chunk)
    write_successes("default", timezone.now(), timezone.now(), [(rid, '["w"]', "1") for rid in chunk])
    assert len(rows) == 100
    assert sequential_scans_of_results() == before, "a chunk scanned the whole result table"
    assert TaskResultRecord.objects.filter(id__in=chunk, status="SUCCESSFUL", return_value=1).count() == 100


@pytest.mark.django_db
def test_a_chunks_result_read_and_update_probe_the_key_while_the_table_is_small():
    """Below some tens of thousands of rows the planner prices a sequential scan under 100
    probes of the key (it takes pages as uncached); a chunk's read and update probe all the
    same, and touch only the chunk's rows."""
    if connection.vendor != "postgresql":
        pytest.skip("plans: PostgreSQL")
    with connection.cursor() as cursor:  # a table as small on disk as in rows (rolled back after the test)
        cursor.execute(f"TRUNCATE {TaskResultRecord._meta.db_table}")
    ids = ready_rows(5_000, "small")
    chunk = ids[1000:1100]
    before = sequential_scans_of_results()
    rows = read_results("default", chunk)
    assert sorted(row[0] for row in rows) == sorted(chunk)
    assert sequential_scans_of_results() == before, "a chunk's read scanned the whole result table"
    write_successes("default", timezone.now(), timezone.now(), [(rid, '["w"]', "1") for rid in chunk])
    assert sequential_scans_of_results() == before, "a chunk's update scanned the whole result table"
    assert TaskResultRecord.objects.filter(id__in=chunk, status="SUCCESSFUL", return_value=1).count() == 100
    assert not TaskResultRecord.objects.exclude(id__in=chunk).exclude(status="READY").exists()
