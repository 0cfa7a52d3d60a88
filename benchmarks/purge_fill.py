"""Filling the ``purge`` benchmark's queue: N expired rows and L live ``Ping`` rows, the
live ones spread evenly through the table in RowVersion order, laid out as
``Transport.send`` lays them out (benchmarks/purge.py says how, per database)."""
from __future__ import annotations

import json
import time

from benchmarks.common import BenchmarkError, Progress, log

QUEUE = "demo"
MESSAGE_TYPE = "Ping"
#: Rows per fill statement (PostgreSQL) / per transaction (SQLite): progress granularity.
FILL_CHUNK = {"postgresql": 100_000, "sqlite": 10_000}
#: The TTL the expired rows were "sent" with (their TimeToBeReceived header), seconds.
EXPIRED_TTL = 60
#: The ids of the live rows, to check every one was handled exactly once.
LIVE_TABLE = "bench_purge_live"


def live_stride(expired: int, live: int) -> int:
    """Row g (1-based) is live when g % k == 0 and g // k <= live."""
    return (expired + live) // live


def fill(kind: str, expired: int, live: int, label: str) -> float:
    """Empty ``demo``, the Ping table and the live-id table, then fill the queue.  Returns seconds."""
    from django.db import connection

    from core.transport import Transport

    d = Transport().dialect
    t = d.table(QUEUE)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        if kind == "postgresql":
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {LIVE_TABLE} (id text PRIMARY KEY)")
            cursor.execute(f"TRUNCATE {t}, sluice_demo_ping, {LIVE_TABLE} RESTART IDENTITY")
        else:
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {LIVE_TABLE} (id TEXT PRIMARY KEY)")
            for table in (t, "sluice_demo_ping", LIVE_TABLE):
                cursor.execute(f"DELETE FROM {table}")
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [QUEUE])
    if kind == "postgresql":
        fill_postgresql(expired, live, label)
    else:
        fill_sqlite(expired, live, label)
    with connection.cursor() as cursor:
        cursor.execute(f'INSERT INTO {LIVE_TABLE} (id) SELECT "Id" FROM {t} WHERE "Expires" IS NULL'
                       if kind == "sqlite" else
                       f'INSERT INTO {LIVE_TABLE} (id) SELECT "Id"::text FROM {t} WHERE "Expires" IS NULL')
        cursor.execute(f"SELECT COUNT(*) FROM {LIVE_TABLE}")
        got = cursor.fetchone()[0]
    if got != live:
        raise BenchmarkError(f"fill: {got} live rows, expected {live}")
    vacuum_started = time.perf_counter()
    if kind == "postgresql":
        with connection.cursor() as cursor:  # Django runs in autocommit: VACUUM is allowed
            cursor.execute(f"VACUUM (ANALYZE) {t}")
            cursor.execute(f"ANALYZE {LIVE_TABLE}")
            cursor.execute("SELECT pg_total_relation_size(%s)", [t])
            size = cursor.fetchone()[0]
        log(f"{label}: VACUUM (ANALYZE) in {time.perf_counter() - vacuum_started:.1f} s; "
            f"table + indexes {size / 2**20:.0f} MiB")
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    elapsed = time.perf_counter() - started
    log(f"{label}: {expired} expired + {live} live rows in {elapsed:.1f} s")
    return elapsed


def fill_postgresql(expired: int, live: int, label: str) -> None:
    from django.db import connection

    from core.conf import get_settings
    from core.messages import Headers
    from core.transport import HOST, Transport

    t = Transport().dialect.table(QUEUE)
    total, k = expired + live, live_stride(expired, live)
    endpoint = json.dumps(get_settings().ENDPOINT)
    machine = json.dumps(HOST)

    def key(name: str) -> str:  # '"Name":' as SQL literal text (header names hold no quotes)
        return json.dumps(name) + ":"

    # The headers Transport.build writes, in its order, as compact JSON (encode_headers).
    headers_sql = (
        f"""'{{{key(Headers.MESSAGE_ID)}"' || r.id::text || '",'"""
        f"""|| '{key(Headers.CORRELATION_ID)}"' || r.id::text || '",'"""
        f"""|| '{key(Headers.CONVERSATION_ID)}"' || gen_random_uuid()::text || '",'"""
        f"""|| '{key(Headers.CONTENT_TYPE)}"application/json",'"""
        f"""|| '{key(Headers.TIME_SENT)}"' || to_char(r.sent AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS:US') || ' Z",'"""
        f"""|| '{key(Headers.ORIGINATING_ENDPOINT)}' || %s || ','"""
        f"""|| '{key(Headers.ORIGINATING_MACHINE)}' || %s || ','"""
        f"""|| '{key(Headers.MESSAGE_INTENT)}"Send",'"""
        f"""|| '{key(Headers.ENCLOSED_MESSAGE_TYPES)}"{MESSAGE_TYPE}"'"""
        f"""|| CASE WHEN r.live THEN '' ELSE ',{key(Headers.TIME_TO_BE_RECEIVED)}"00:01:00"' END"""
        f"""|| '}}'"""
    )
    # RowVersion is given explicitly (= g, so the order is the series' order without a sort
    # of wide rows); the identity sequence is moved past it afterwards.
    statement = (
        f'INSERT INTO {t} ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers", "Body", '
        f'"RowVersion") '
        f"SELECT r.id, r.id::text, NULL, TRUE, CASE WHEN r.live THEN NULL ELSE r.at - interval '1 hour' END, "
        f"{headers_sql}, convert_to('{{}}', 'UTF8'), r.g "
        f"FROM (SELECT g, gen_random_uuid() AS id, (g %% %s = 0 AND g / %s <= %s) AS live, "
        f"statement_timestamp() AS at, "
        f"CASE WHEN g %% %s = 0 AND g / %s <= %s THEN statement_timestamp() "
        f"ELSE statement_timestamp() - interval '1 hour' - make_interval(secs => %s) END AS sent "
        f"FROM generate_series(%s::bigint, %s::bigint) AS g) AS r"
    )
    progress = Progress(label, total)
    chunk = FILL_CHUNK["postgresql"]
    with connection.cursor() as cursor:
        for first in range(1, total + 1, chunk):
            last = min(first + chunk - 1, total)
            cursor.execute(statement, [endpoint, machine, k, k, live, k, k, live, EXPIRED_TTL, first, last])
            progress.update(last)
        cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'RowVersion'), %s)", [t, total])
    progress.done()
    check_headers_like_send()


def check_headers_like_send() -> None:
    """The generated rows must carry the header names Transport.build gives a Ping."""
    from django.db import connection

    from core.messages import Headers, decode_headers
    from core.transport import Transport

    t = Transport().dialect.table(QUEUE)
    built = Transport().build(QUEUE, {}, message_type=MESSAGE_TYPE)
    built_ttl = Transport().build(QUEUE, {}, message_type=MESSAGE_TYPE, ttl=EXPIRED_TTL)
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT "Id"::text, "Headers" FROM {t} WHERE "Expires" IS NULL ORDER BY "RowVersion" LIMIT 1')
        live_id, live_headers = cursor.fetchone()
        cursor.execute(f'SELECT "Headers" FROM {t} WHERE "Expires" IS NOT NULL ORDER BY "RowVersion" LIMIT 1')
        expired_headers = cursor.fetchone()[0]
    live_h, expired_h = decode_headers(live_headers), decode_headers(expired_headers)
    if list(live_h) != list(built.headers) or list(expired_h) != list(built_ttl.headers):
        raise BenchmarkError(f"fill: generated headers {list(live_h)} / {list(expired_h)} differ from "
                             f"Transport.build's {list(built.headers)} / {list(built_ttl.headers)}")
    if live_h[Headers.MESSAGE_ID] != live_id or expired_h[Headers.TIME_TO_BE_RECEIVED] != built_ttl.headers[
            Headers.TIME_TO_BE_RECEIVED]:
        raise BenchmarkError(f"fill: generated header values look wrong: {live_h} / {expired_h}")


def fill_sqlite(expired: int, live: int, label: str) -> None:
    import datetime as dt

    from django.db import connection, transaction

    from core.messages import encode_headers
    from core.transport import Transport

    transport = Transport()
    d = transport.dialect
    total, k = expired + live, live_stride(expired, live)
    insert = d.insert_with_expires(QUEUE)
    progress = Progress(label, total)
    chunk = FILL_CHUNK["sqlite"]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {d.now_sql()}", [])
        expires = d.datetime_param(d.to_datetime(cursor.fetchone()[0]) - dt.timedelta(hours=1))
    for first in range(1, total + 1, chunk):
        rows = []
        for g in range(first, min(first + chunk - 1, total) + 1):
            is_live = g % k == 0 and g // k <= live
            m = transport.build(QUEUE, {}, message_type=MESSAGE_TYPE, ttl=None if is_live else EXPIRED_TTL)
            rows.append([m.row_id, m.correlation_id, m.reply_to, None if is_live else expires,
                         encode_headers(m.headers), m.body])
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.executemany(insert, rows)
        progress.update(first + len(rows) - 1)
    progress.done()
