"""The values of the ``SLUICE_*`` options that are structures, not one number or word:
parsed and checked here (ValueError naming the bad item), for the options' checks
(core.conf.options) and for their readers (core.runtime.limits, core.records.run)."""
from __future__ import annotations

from typing import Any, Mapping


#: The largest concurrency or rate limit: each is that many rows of the queue's in the database.
MAX_QUEUE_LIMIT = 10_000
QUEUE_LIMIT_KINDS = ("concurrency", "rate")


def limit_value(kind: str, value: Any, where: str) -> int | None:
    """One limit (``kind`` of QUEUE_LIMIT_KINDS) as a whole number 1–MAX_QUEUE_LIMIT, None
    for none; a ValueError naming ``where`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_QUEUE_LIMIT:
        unit = " (messages per second)" if kind == "rate" else " (messages at once)"
        raise ValueError(f"{where}: {kind} must be a whole number 1–{MAX_QUEUE_LIMIT}{unit}, not {value!r:.40}")
    return value


def queue_limits(value: Any) -> dict[str, tuple[int | None, int | None]]:
    """SLUICE_QUEUE_LIMITS as {queue: (concurrency, rate)}; a ValueError naming the bad item."""
    if not isinstance(value, Mapping):
        raise ValueError(f'SLUICE_QUEUE_LIMITS must be a dict such as {{"emails": {{"concurrency": 2, "rate": 10}}}}, '
                         f"not {type(value).__name__}")
    found = {}
    for queue, limits in value.items():
        where = f"SLUICE_QUEUE_LIMITS[{queue!r}]"
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"{where}: a queue name must be a non-empty string")
        if not isinstance(limits, Mapping) or not limits or set(limits) - set(QUEUE_LIMIT_KINDS):
            raise ValueError(f"{where} must be a dict with concurrency and/or rate, not {limits!r:.80}")
        found[queue] = (limit_value("concurrency", limits.get("concurrency"), where),
                        limit_value("rate", limits.get("rate"), where))
    return found


def spark_conf(text: str) -> dict[str, str]:
    """SLUICE_SPARK_CONF as a dict (pipeline.job.parse_conf; ValueError names a bad item)."""
    from pipeline.job import parse_conf

    return parse_conf(text) if text.strip() else {}
