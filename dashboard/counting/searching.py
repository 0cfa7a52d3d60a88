"""Reading failed messages without scanning a million rows: free-text search, its count and
the groups list shared through the snapshot's cache (:func:`shared_count`,
:func:`cached_groups`).

- PostgreSQL indexes the searched text with trigrams (core/dialects, index sluice_fm_search):
  a term of 3 characters or more is an index lookup.
- A term of 1 or 2 characters has no trigram to look up, on any database: it is refused
  with a message ("type at least 3 characters") rather than run as a scan.
- SQLite and SQL Server have no such index: the search looks at the newest
  :data:`UNINDEXED_SCAN` records only, and the page says so.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from django.db import connections
from django.db.models import Max, QuerySet

from core import failures
from core.conf import get_settings
from core.dialects import dialect_for
from core.models import FailedMessage
from dashboard.counting import stats

MIN_TEXT = 3
#: Records a search without an index looks through (the newest).
UNINDEXED_SCAN = 100_000


class TextTooShort(ValueError):
    """A search text shorter than MIN_TEXT characters."""


@dataclass(frozen=True)
class Bound:
    #: Why results may be missing ("" when the search saw everything).
    note: str = ""


def check_text(text: str) -> None:
    if text and len(text.strip()) < MIN_TEXT:
        raise TextTooShort(f"type at least {MIN_TEXT} characters to search the text (a shorter one would "
                           "read every failed message); or search by exact message id, queue or type")


def bound(qs: QuerySet, text: str) -> tuple[QuerySet, Bound]:
    """``qs`` (a failures.search with ``text``) limited so it reads a bounded number of rows."""
    if not text:
        return qs, Bound()
    using = get_settings().DATABASE
    if dialect_for(connections[using]).failed_search_expression() is not None:
        return qs, Bound()
    newest = FailedMessage.objects.using(using).aggregate(m=Max("pk"))["m"] or 0
    if newest <= UNINDEXED_SCAN:
        return qs, Bound()
    return qs.filter(pk__gt=newest - UNINDEXED_SCAN), Bound(
        f"This database has no text index: the search looked at the newest {UNINDEXED_SCAN:,} failed messages "
        "only. Filter by queue, type, exception or dates to reach older ones.")


def cached_groups(by: str, status: str, queue: str, message_type: str, limit: int) -> list[failures.FailureGroup]:
    """The ``limit`` largest groups, cut in SQL and shared by every viewer (pages and API)
    like the overview's snapshot (:func:`stats.shared`: refreshed in the background, and
    forgotten after an action): grouping a million records costs a few hundred
    milliseconds, too much for every view."""
    key = "sluice:dashboard:groups:" + hashlib.sha1(repr((by, status, queue, message_type, limit)).encode()).hexdigest()
    return stats.shared(key, lambda: failures.groups(by, status=status, queue=queue or None,
                                                     message_type=message_type or None, limit=limit))


def shared_count(qs: QuerySet, cap: int, filters: tuple) -> int:
    """``qs``'s rows counted up to ``cap`` + 1, shared by every viewer of the same
    ``filters`` like the groups (:func:`stats.shared`: fresh for
    SLUICE_DASHBOARD_CACHE_SECONDS, then served up to 30 s old while one background thread
    counts again; an action starts afresh).  The next page of a search, or the same search
    again, does not count again: with a text search the count rechecks every row the
    trigram index offers (tens of milliseconds at a million failed messages), where the
    page of results stops at its limit."""
    key = "sluice:dashboard:failed-count:" + hashlib.sha1(repr((cap, filters)).encode()).hexdigest()
    return stats.shared(key, lambda: qs.order_by()[:cap + 1].count())
