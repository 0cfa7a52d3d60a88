"""``NServiceBus.TimeSent`` and ``DeliverAt`` (``2026-11-22 04:15:16:123456 Z``) are read by
hand, on hot paths: the answers are strptime's, for the form Sluice writes and for anything
else (which strptime still reads or refuses)."""
from __future__ import annotations

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import WIRE_TIME_FORMAT, wire_time, parse_wire_time
from core.records.writer import sent_us


def by_strptime(text: str) -> dt.datetime | str:
    try:
        return dt.datetime.strptime(text, WIRE_TIME_FORMAT).replace(tzinfo=dt.timezone.utc)
    except ValueError:
        return "refused"


def ours(text: str) -> dt.datetime | str:
    try:
        return parse_wire_time(text)
    except ValueError:
        return "refused"


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
times = st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(9999, 12, 30),
                     timezones=st.just(dt.timezone.utc))
near_misses = st.builds(lambda y, mo, d, h, mi, s, f, z: f"{y}-{mo}-{d} {h}:{mi}:{s}:{f}{z}",
                        st.sampled_from(["2026", "202", "20266"]), st.sampled_from(["11", "2", "13", "00"]),
                        st.sampled_from(["26", "30", "31", "1"]), st.sampled_from(["06", "24", "6"]),
                        st.sampled_from(["30", "60"]), st.sampled_from(["01", "59", "60", "61"]),
                        st.sampled_from(["1", "123456", "1234567", ""]), st.sampled_from([" Z", "Z", " z", ""]))


@settings(max_examples=300, deadline=None)
@given(times)
def test_what_sluice_writes_reads_back_exactly(when):
    text = wire_time(when)
    assert parse_wire_time(text) == by_strptime(text) == when
    assert sent_us(text) == (when - EPOCH) // dt.timedelta(microseconds=1)


@settings(max_examples=300, deadline=None)
@given(st.one_of(near_misses, st.text(max_size=40)))
def test_anything_else_gets_strptimes_answer(text):
    assert ours(text) == by_strptime(text)
