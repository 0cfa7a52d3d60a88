"""How long de-duplication data must be kept: longer than a message can keep coming back."""
from __future__ import annotations

from core.conf import get_settings


def longest_retry_window(settings=None) -> float:
    """Seconds a message can keep coming back: its delayed retries (the n-th waits
    n × SLUICE_DELAYED_RETRY_INCREASE), plus one peek delay per attempt (a retried message
    waits at the end of its queue)."""
    s = settings or get_settings()
    delays = [s.DELAYED_RETRY_INCREASE * n for n in range(1, s.DELAYED_RETRIES + 1)]
    attempts = (s.IMMEDIATE_RETRIES + 1) * (s.DELAYED_RETRIES + 1)
    return sum(delays) + attempts * s.PEEK_DELAY


def retention_warnings(settings=None) -> list[str]:
    """Why the retention might let duplicates through (empty when it is long enough)."""
    s = settings or get_settings()
    keep = s.OUTBOX_KEEP_DEDUPLICATION_DATA_FOR
    window = longest_retry_window(s)
    warnings = []
    if keep < window:
        warnings.append(
            f"SLUICE_OUTBOX_KEEP_DEDUPLICATION_DATA_FOR is {keep:g} s, shorter than the longest retry window "
            f"({window:g} s of immediate and delayed retries): a copy of a message arriving after its record is "
            "cleaned up would be processed again"
        )
    return warnings
