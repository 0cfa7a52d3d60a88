"""The Spark job's output (Parquet) → ``MetricWindow`` rows, and reading them back.

Results go through the driver (this process), not JDBC from the executors: a run's
windows are a few per queue and message type per minute — tens of thousands of rows for
ten million records — so loading them is a second's work, and one code path serves
SQLite, PostgreSQL and SQL Server alike, in one transaction (a re-run replaces its
windows atomically; the dashboard never sees half a run), with no database credentials
or JDBC jars shipped to a cluster.
"""
from __future__ import annotations

import datetime as dt
import math
from typing import Any

from django.db import transaction

from core.conf import get_settings
from core.db import database_now_us
from core.records.extra import require
from core.records.location import location
from core.models.monitoring import WINDOWS_LOADED, RollupMark
from core.models.records import MetricWindow
from pipeline import schema
from pipeline.job import hour_floor

LOAD_BATCH = 500


class NoResults(Exception):
    """The job's output is missing or unfinished: loading it would delete windows and add none."""


def read_results(path: str) -> list[dict[str, Any]]:
    """The metric rows the job wrote to ``path`` (a directory of Parquet files).

    Only a finished output is read: Spark writes ``_SUCCESS`` last, after every file.  A
    missing or failed one raises :class:`NoResults` (loading it would replace every window
    from ``--since`` on with nothing)."""
    require("pyarrow")
    where = location(path)
    marker = where.join("_SUCCESS")
    try:
        found = where.fs.get_file_info(marker).type.name != "NotFound"
    except OSError as exc:
        raise NoResults(f"cannot read the job's output at {path}: {exc}") from None
    if not found:
        raise NoResults(f"no finished job output at {path} (no _SUCCESS marker: the job failed, is still "
                        f"running, or wrote elsewhere); the windows were left as they are")
    import pyarrow.dataset as ds  # not at module level: see core.records.export

    table = ds.dataset(where.path, filesystem=where.fs, format="parquet").to_table()
    return table.to_pylist()


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def load_results(rows: list[dict[str, Any]], since: dt.datetime | None = None,
                 using: str | None = None) -> int:
    """Replace the windows the run covered by ``rows``; returns how many were loaded.

    Covered = every window starting at or after ``since``'s hour (the job's own lower
    bound), or, without ``since``, at or after the earliest window of each size in
    ``rows``.  Replaced in one transaction."""
    using = using or get_settings().DATABASE
    objects = []
    for row in rows:
        start = row["window_start"]
        if start.tzinfo is None:  # Spark's timestamps are UTC instants
            start = start.replace(tzinfo=dt.timezone.utc)
        objects.append(MetricWindow(**{name: _clean(row[name]) for name in schema.METRIC_COLUMNS
                                       if name != "window_start"}, window_start=start))
    with transaction.atomic(using=using):
        manager = MetricWindow.objects.using(using)
        for seconds in schema.WINDOWS:
            starts = [o.window_start for o in objects if o.window_seconds == seconds]
            if since is not None:
                manager.filter(window_seconds=seconds, window_start__gte=hour_floor(since)).delete()
            elif starts:
                manager.filter(window_seconds=seconds, window_start__gte=min(starts)).delete()
        manager.bulk_create(objects, batch_size=LOAD_BATCH)
        # Readers that keep window rows (core.monitoring.windows) see that they were replaced.
        RollupMark.objects.using(using).update_or_create(name=WINDOWS_LOADED,
                                                          defaults={"until_us": database_now_us(using)})
    return len(objects)


def load_path(path: str, since: dt.datetime | None = None, using: str | None = None) -> int:
    """Load the job's output at ``path`` (what `sluice pipeline load` does after spark-submit)."""
    return load_results(read_results(path), since, using)
