"""Processing records and the analytics pipeline, Django side.

- :mod:`core.models.records`: the record, watermark, run and metric-window tables (with the
  engine's other models);
- :mod:`core.records.writer`: the pump's per-batch writer (one statement per receive
  batch, COPY or a multi-row INSERT, in the receive's own transaction);
- :mod:`core.records.export`: records → Parquet data set, incrementally (watermark);
- :mod:`core.records.horizon`: where the export may cut without passing a record over;
- :mod:`core.records.retention`: exported records leave the database after the retention;
- :mod:`core.records.results`: the Spark job's output → ``MetricWindow`` rows;
- :mod:`core.records.run`: export + job + load, behind a lease (CLI, beat, dashboard);
- :mod:`core.records.package`: the job as a zip for spark-submit ``--py-files``;
- :mod:`core.records.conversations`: a conversation's messages, from records and failures;
- :mod:`core.records.extra`: the optional ``pipeline`` extra (pyspark, pyarrow), checked.

The Spark job itself is the top-level ``pipeline`` package (no Django).
"""
