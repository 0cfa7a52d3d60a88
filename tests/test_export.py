"""`sluice records export` (watermark, crash between file and watermark, chunks and date
partitions), retention, and `sluice pipeline run` end to end into MetricWindow."""
from __future__ import annotations

import datetime as dt
import json
import time
from io import StringIO

import pyarrow.dataset as ds
import pytest
from django.core.management import CommandError, call_command
from django.test.utils import override_settings

from core.records.export import Export, export_records, watermark
from core.models.records import ExportWatermark, MetricWindow, PipelineRun, ProcessingRecord
from core.records.retention import delete_exported
from core.records.writer import insert_rows, now_us
from tests.pipeline_support import actual_windows, assert_same_windows, expected_windows, make_records

HOUR = 3_600_000_000


def add_records(count: int, *, ended_us: int | None = None, span_s: int = 600, seed: int = 3) -> list[dict]:
    """``count`` records in the database (ending about now, or from ``ended_us``); returns them
    as tests/pipeline_support dicts with their database ids."""
    start = dt.datetime.fromtimestamp(((ended_us or now_us() - span_s * 1_000_000 - 60_000_000)) / 1e6,
                                      dt.timezone.utc)
    records = make_records(count, start, span_s=span_s, seed=seed)
    insert_rows([(r["message_id"], r["message_type"], r["queue"], r["endpoint"], r["sent"], r["started"],
                  r["ended"], r["outcome"], r["attempt"], r["deliver_at"]) for r in records], "default")
    ids = list(ProcessingRecord.objects.order_by("-id").values_list("id", flat=True)[:count])[::-1]
    for r, pk in zip(records, ids):
        r["id"] = pk
    return records


def dataset_rows(path) -> list[dict]:
    if not path.exists():
        return []
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist()


@pytest.fixture
def records_path(tmp_path, settings):
    settings.SLUICE_RECORDS_PATH = str(tmp_path / "records")
    settings.SLUICE_METRICS_PATH = str(tmp_path / "metrics")
    settings.SLUICE_RECORDS_EXPORT_DELAY = 0
    start_at_the_sequence()
    return tmp_path / "records"


def start_at_the_sequence() -> int:
    """Put the watermark where the id sequence is (flushing the tables between tests does
    not reset it): ids 1, 2, ... of earlier tests would otherwise be a hole the export waits
    for until its horizon settles — on a shared PostgreSQL, when others' transactions end."""
    insert_rows([("seq", None, "q", "e", None, 0, 0, "processed", 1, None)], "default")
    last = ProcessingRecord.objects.get(message_id="seq").id
    ProcessingRecord.objects.filter(id=last).delete()
    ExportWatermark.objects.update_or_create(name="records", defaults={"last_id": last})
    return last


def test_export_is_incremental(transactional_db, records_path):
    first = add_records(120)
    result = export_records()
    assert result.exported == 120 and watermark() == first[-1]["id"] == result.last_id
    rows = dataset_rows(records_path)
    assert sorted(r["id"] for r in rows) == [r["id"] for r in first]
    one = next(r for r in rows if r["id"] == first[5]["id"])
    assert one["outcome"] == first[5]["outcome"] and one["queue"] == first[5]["queue"]
    assert int(one["ended"].timestamp() * 1_000_000) == first[5]["ended"]
    assert str(one["date"]) == one["ended"].date().isoformat()
    assert export_records().exported == 0  # nothing new: nothing twice
    second = add_records(30, seed=4)
    assert export_records().exported == 30
    assert sorted(r["id"] for r in dataset_rows(records_path)) == [r["id"] for r in first + second]


def test_records_just_handled_are_exported_at_once(transactional_db, records_path):
    """No hold-back by age: committed records with no hole before them are final (the
    watermark once waited SLUICE_RECORDS_EXPORT_DELAY and a first run exported nothing)."""
    add_records(10, ended_us=now_us() - 3600 * 1_000_000, span_s=60)
    add_records(5, ended_us=now_us() - 2_000_000, span_s=1)
    result = export_records(delay=600)
    assert (result.exported, result.held_back, result.held_reason) == (15, 0, "")


def export_until_settled(want: int, **options) -> int:
    """Export until ``want`` records are out (or 30 s pass): on PostgreSQL a gap is final only
    once every transaction open when it was seen has ended, and a transaction of another
    test process on the same server (make test runs its passes at once) holds it back."""
    exported, deadline = 0, time.monotonic() + 30
    while True:
        exported += export_records(**options).exported
        if exported >= want or time.monotonic() > deadline:
            return exported
        time.sleep(0.2)


def test_chunks_and_date_partitions(transactional_db, records_path):
    midnight = dt.datetime.combine(dt.date.today(), dt.time(), dt.timezone.utc)
    records = add_records(50, ended_us=int(midnight.timestamp() * 1e6) - 300 * 1_000_000, span_s=600)
    gap = [r["id"] for r in records[10:30]]  # rolled-back batches leave holes wider than a chunk
    ProcessingRecord.objects.filter(id__in=gap).delete()
    records = [r for r in records if r["id"] not in gap]
    assert export_until_settled(30, chunk=7) == 30
    assert watermark() == records[-1]["id"]
    dates = sorted(p.name for p in records_path.iterdir())
    assert dates == [f"date={(midnight - dt.timedelta(days=1)).date()}", f"date={midnight.date()}"]
    assert sorted(r["id"] for r in dataset_rows(records_path)) == [r["id"] for r in records]
    assert not list(records_path.rglob(".*"))  # no temporary file left


def test_a_crash_between_files_and_watermark_exports_nothing_twice(transactional_db, records_path):
    start = watermark()
    first = add_records(40)
    crashed = Export()
    crashed.write()  # the files are in place, then the process dies: no commit()
    assert watermark() == start and len(dataset_rows(records_path)) == 40
    second = add_records(25, seed=5)
    result = export_records()
    assert result.exported == 65
    ids = [r["id"] for r in dataset_rows(records_path)]
    assert sorted(ids) == [r["id"] for r in first + second]  # each once
    assert watermark() == second[-1]["id"]


def test_retention_deletes_only_exported_old_records(transactional_db, records_path):
    old = add_records(30, ended_us=now_us() - 3 * 24 * HOUR, span_s=60)
    export_records()
    old_unexported = add_records(10, ended_us=now_us() - 3 * 24 * HOUR, span_s=60, seed=6)
    recent = add_records(10, seed=7)
    ProcessingRecord.objects.filter(id__in=[r["id"] for r in recent]).update(ended_us=now_us())
    ExportWatermark.objects.update(last_id=old[-1]["id"])  # `recent` not exported either
    assert delete_exported(retention=24 * 3600, batch=7) == 30
    left = set(ProcessingRecord.objects.values_list("id", flat=True))
    assert left == {r["id"] for r in old_unexported + recent}
    assert delete_exported(retention=24 * 3600) == 0


def test_records_export_command(transactional_db, records_path):
    add_records(12)
    out = StringIO()
    call_command("sluice", "records", "export", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["exported"] == 12 and data["watermark"] == watermark() and len(data["files"]) >= 1


def test_pipeline_run_command_loads_every_window(transactional_db, records_path, spark):
    records = add_records(600, span_s=2 * 3600)
    out = StringIO()
    call_command("sluice", "pipeline", "run", "--json", stdout=out)
    line = json.loads(out.getvalue())
    assert list(line)[:4] == ["exported", "windows", "seconds", "spark_master"]  # extended, never renamed
    assert line["exported"] == 600 and line["spark_master"] == "local[2]"  # the running session's
    assert line["windows"] == MetricWindow.objects.count()
    assert_same_windows(actual_windows(MetricWindow.objects.values()), expected_windows(records))
    run = PipelineRun.objects.get()
    assert (run.status, run.stage, run.progress, run.exported) == ("succeeded", "done", 100, 600)

    # Re-running a window replaces it: more records in the last hour, recomputed from --since.
    more = add_records(50, span_s=60, seed=9)
    out = StringIO()
    # From the earliest of them: their end times are random over the minute, which may
    # straddle an hour boundary (more[0] would then miss the earlier hour's windows).
    call_command("sluice", "pipeline", "run", "--json", "--since",
                 dt.datetime.fromtimestamp(min(r["ended"] for r in more) / 1e6, dt.timezone.utc).isoformat(),
                 stdout=out)
    assert json.loads(out.getvalue())["exported"] == 50
    assert_same_windows(actual_windows(MetricWindow.objects.values()), expected_windows(records + more))
    # Nothing new, no --since: no job, the windows stay.
    out = StringIO()
    call_command("sluice", "pipeline", "run", "--json", stdout=out)
    assert json.loads(out.getvalue())["windows"] == 0
    assert_same_windows(actual_windows(MetricWindow.objects.values()), expected_windows(records + more))


def test_pipeline_bad_input(transactional_db, records_path):
    with pytest.raises(CommandError, match="--since wants an ISO 8601"):
        call_command("sluice", "pipeline", "run", "--since", "last tuesday")
    with override_settings(SLUICE_SPARK_DRIVER_MEMORY="lots"):
        with pytest.raises(ValueError, match="SLUICE_SPARK_DRIVER_MEMORY"):
            from core.conf import get_settings
            get_settings()


def test_pipeline_run_refused_while_another_holds_the_lease(transactional_db, records_path):
    from core.runtime.lease import Lease
    from core.records.run import LEASE

    other = Lease(LEASE, 60, "default")
    assert other.acquire()
    try:
        with pytest.raises(CommandError, match="another pipeline run"):
            call_command("sluice", "pipeline", "run")
        assert PipelineRun.objects.get().status == "skipped"
    finally:
        other.release()
