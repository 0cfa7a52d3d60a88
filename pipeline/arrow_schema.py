"""The processing-record data set's Arrow schema (see :mod:`pipeline.schema` for the layout):
what the exporter writes and the Spark job reads."""
from __future__ import annotations

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")
RECORD_SCHEMA = pa.schema([
    ("id", pa.int64()),
    ("message_id", pa.string()),
    ("message_type", pa.string()),
    ("queue", pa.string()),
    ("endpoint", pa.string()),
    ("sent", TIMESTAMP),
    ("started", TIMESTAMP),
    ("ended", TIMESTAMP),
    ("outcome", pa.string()),
    ("attempt", pa.int32()),
    # Last: files written before it existed lack it, and read it as null.
    ("deliver_at", TIMESTAMP),
])
