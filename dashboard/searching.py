"""Free-text search over failed messages that never scans a million rows.

- PostgreSQL indexes the searched text with trigrams (core/dialects, index sluice_fm_search):
  a term of 3 characters or more is an index lookup.
- A term of 1 or 2 characters has no trigram to look up, on any database: it is refused
  with a message ("type at least 3 characters") rather than run as a scan.
- SQLite and SQL Server have no such index: the search looks at the newest
  :data:`UNINDEXED_SCAN` records only, and the page says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import connections
from django.db.models import Max, QuerySet

from core.conf import get_settings
from core.dialects import dialect_for
from core.models import FailedMessage

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
