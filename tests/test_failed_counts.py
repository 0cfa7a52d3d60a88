"""Failed messages counted by the database per group and per queue (core.models.FailedGroup,
FailedQueueCount, kept by triggers): whatever writes the records — the ORM one by one or in
bulk, a queryset update or delete, raw SQL, two writers at once — the counts, first and last
times are what grouping the records would say, and the groups page reads them largest first."""
from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, connections, transaction
from hypothesis import HealthCheck, given, settings, strategies as st

from core.dialects.failed_counts_sql import GROUP_TABLE, QUEUE_TABLE, backfill
from core.dialects.mssql import MSSQLDialect
from core.failures import groups
from core.models import FailedGroup, FailedMessage, FailedQueueCount, FailureStatus
from tests.conftest import database_vendor
from tests.failed_counts_support import (
    assert_failed_counts_kept, counted_from_records, kept, kept_by_queue, queues_from_records,
)

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
STATUSES = list(FailureStatus.values)
KEYS = ["k-timeout", "k-value", "k-key"]
QUEUES = ["orders", "billing", "orders@host-1"]


def failed(n: int, key: str = "k-timeout", status: str = FailureStatus.UNRESOLVED, minute: int = 0,
           queue: str = "orders") -> FailedMessage:
    at = T0 + dt.timedelta(minutes=minute)
    return FailedMessage(message_id=f"m{n}", original_queue=queue, message_type="PlaceOrder",
                         exception_type=f"E{key}", group_key=key, group_title=f"E{key} at handlers.py:handle",
                         time_of_failure=at, first_failed_at=at, last_failed_at=at, status=status)


def test_groups_are_read_largest_first_with_their_title_and_times(transactional_db):
    FailedMessage.objects.bulk_create([failed(i, "k-value", minute=i) for i in range(3)]
                                      + [failed(10 + i, "k-timeout", minute=20 + i) for i in range(2)]
                                      + [failed(20, "k-key", minute=5), failed(21, "k-key", FailureStatus.ARCHIVED)])
    shown = groups()
    assert [(g.group_key, g.count) for g in shown] == [("k-value", 3), ("k-timeout", 2), ("k-key", 1)]
    top = shown[0]
    assert (top.title, top.exception_type) == ("Ek-value at handlers.py:handle", "Ek-value")
    assert (top.first_failed, top.last_failed) == (T0, T0 + dt.timedelta(minutes=2))
    assert [(g.group_key, g.count) for g in groups(status=FailureStatus.ARCHIVED)] == [("k-key", 1)]
    assert len(groups(limit=2)) == 2
    # Equal counts: the group that failed last comes first.
    FailedMessage.objects.filter(message_id="m0").delete()
    assert [g.group_key for g in groups()] == ["k-timeout", "k-value", "k-key"]
    assert_failed_counts_kept()


def test_queryset_updates_and_deletes_move_records_between_groups(transactional_db):
    FailedMessage.objects.bulk_create([failed(i, KEYS[i % 3], minute=i) for i in range(30)])
    FailedMessage.objects.filter(group_key="k-value").update(status=FailureStatus.RESOLVED)
    FailedMessage.objects.filter(message_id__in=["m0", "m3"]).update(group_key="k-value")
    FailedMessage.objects.filter(message_id="m6").update(time_of_failure=T0 + dt.timedelta(days=1))
    FailedMessage.objects.filter(group_key="k-key", status=FailureStatus.UNRESOLVED)[:1].get().delete()
    assert_failed_counts_kept()
    assert kept()[(FailureStatus.UNRESOLVED, "k-timeout")][2] == T0 + dt.timedelta(days=1)
    FailedMessage.objects.all().delete()
    assert kept() == {} and FailedGroup.objects.count() > 0  # rows stay, at zero, without times
    assert_failed_counts_kept()


def test_raw_sql_is_counted_too(transactional_db):
    FailedMessage.objects.bulk_create([failed(i, minute=i) for i in range(4)])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE sluice_failed_message SET status = %s WHERE message_id IN (%s, %s)",
                       [FailureStatus.ARCHIVED, "m1", "m2"])
        cursor.execute("DELETE FROM sluice_failed_message WHERE message_id = %s", ["m3"])
    assert kept() == {(FailureStatus.UNRESOLVED, "k-timeout"): (1, T0, T0),
                      (FailureStatus.ARCHIVED, "k-timeout"): (2, T0 + dt.timedelta(minutes=1),
                                                              T0 + dt.timedelta(minutes=2))}
    assert_failed_counts_kept()


def test_a_rolled_back_write_leaves_the_counts_as_they_were(transactional_db):
    FailedMessage.objects.bulk_create([failed(i) for i in range(2)])
    before = kept()
    with pytest.raises(RuntimeError), transaction.atomic():
        FailedMessage.objects.bulk_create([failed(10 + i, "k-key") for i in range(5)])
        FailedMessage.objects.filter(message_id="m0").delete()
        raise RuntimeError("rolled back")
    assert kept() == before


def test_the_migrations_backfill_counts_what_the_triggers_keep(transactional_db):
    FailedMessage.objects.bulk_create([failed(i, KEYS[i % 3], STATUSES[i % 4], minute=i, queue=QUEUES[i % 3])
                                       for i in range(40)])
    triggers_kept, by_queue = kept(), kept_by_queue()
    FailedGroup.objects.all().delete()
    FailedQueueCount.objects.all().delete()
    with connection.cursor() as cursor:
        for statement in backfill():
            cursor.execute(statement)
    assert kept() == triggers_kept == counted_from_records()
    assert kept_by_queue() == by_queue == queues_from_records()


# -- any sequence of writes ------------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from(STATUSES),
                                                    st.integers(0, 50), st.sampled_from(QUEUES)),
                                          min_size=1, max_size=6)),
    st.tuples(st.just("requeue"), st.integers(0, 40), st.sampled_from(QUEUES)),
    st.tuples(st.just("status"), st.sampled_from(KEYS), st.sampled_from(STATUSES)),
    st.tuples(st.just("regroup"), st.integers(0, 40), st.sampled_from(KEYS)),
    st.tuples(st.just("retime"), st.integers(0, 40), st.integers(0, 50)),
    st.tuples(st.just("save"), st.integers(0, 40), st.sampled_from(STATUSES)),
    st.tuples(st.just("delete"), st.integers(0, 40)),
    st.tuples(st.just("delete_group"), st.sampled_from(KEYS), st.sampled_from(STATUSES)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(operation, min_size=1, max_size=12))
def test_any_sequence_of_writes_keeps_the_counts(transactional_db, operations):
    FailedMessage.objects.all().delete()
    FailedGroup.objects.all().delete()
    FailedQueueCount.objects.all().delete()
    serial = 0
    for op, *args in operations:
        if op == "insert":
            batch = [failed(serial + i, key, status, minute, queue)
                     for i, (key, status, minute, queue) in enumerate(args[0])]
            serial += len(batch)
            FailedMessage.objects.bulk_create(batch)
        elif op == "status":
            FailedMessage.objects.filter(group_key=args[0]).update(status=args[1])
        elif op == "regroup":
            FailedMessage.objects.filter(message_id=f"m{args[0]}").update(group_key=args[1])
        elif op == "requeue":
            FailedMessage.objects.filter(message_id=f"m{args[0]}").update(original_queue=args[1])
        elif op == "retime":
            FailedMessage.objects.filter(message_id=f"m{args[0]}").update(
                time_of_failure=T0 + dt.timedelta(minutes=args[1]))
        elif op == "save":
            found = FailedMessage.objects.filter(message_id=f"m{args[0]}").first()
            if found is not None:
                found.status = args[1]
                found.save(update_fields=["status"])
        elif op == "delete":
            FailedMessage.objects.filter(message_id=f"m{args[0]}").delete()
        else:
            FailedMessage.objects.filter(group_key=args[0], status=args[1]).delete()
        assert_failed_counts_kept()


@pytest.mark.skipif(database_vendor() != "postgresql", reason="concurrent writers: PostgreSQL")
def test_concurrent_writers_to_one_group_count_every_record(transactional_db):
    """Eight threads, each its own connection and transaction, insert into one new group
    and remove from it at once; the count row queues them."""
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            start.wait(10)
            with transaction.atomic():
                FailedMessage.objects.bulk_create([failed(n * 100 + i, "k-busy", minute=n) for i in range(20)])
                FailedMessage.objects.filter(message_id=f"m{n * 100}").delete()
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert kept()[(FailureStatus.UNRESOLVED, "k-busy")] == (8 * 19, T0, T0 + dt.timedelta(minutes=7))
    assert_failed_counts_kept()


def test_sql_server_trigger_takes_away_merges_and_reads_times_from_the_index():
    """No SQL Server here: the trigger's T-SQL is checked for what it must do."""
    [trigger] = MSSQLDialect().failed_count_triggers()
    assert trigger.startswith("CREATE TRIGGER sluice_fm_counts ON sluice_failed_message AFTER INSERT, UPDATE, DELETE")
    assert "SET NOCOUNT ON" in trigger and "%" not in trigger
    for table in (GROUP_TABLE, QUEUE_TABLE):
        assert f"MERGE {table} WITH (HOLDLOCK)" in trigger and f"UPDATE c SET records = c.records - o.n FROM {table}" in trigger
    assert trigger.count("WHEN MATCHED") == trigger.count("WHEN NOT MATCHED") == 2
    assert "FROM deleted GROUP BY status, group_key" in trigger and "FROM inserted GROUP BY status, original_queue" in trigger
    assert "SELECT MIN(m.time_of_failure)" in trigger and "SELECT MAX(m.time_of_failure)" in trigger
    assert trigger.rstrip().endswith("END")
    assert MSSQLDialect().drop_failed_count_triggers() == ["DROP TRIGGER IF EXISTS sluice_fm_counts"]
