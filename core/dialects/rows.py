"""A queue row's shape: the columns of a queue table, the columns a receive returns, and a
fetched row as Python values (:class:`Row`, its Id in canonical UUID text)."""
from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any, NamedTuple

#: Columns of a queue table, as the SQL transport lays them out.
COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Recoverable", "Expires", "Headers", "Body", "RowVersion")
#: Columns a receive / browse returns, in this order, then the expired flag.
MESSAGE_COLUMNS = ("Id", "CorrelationId", "ReplyToAddress", "Expires", "Headers", "Body", "RowVersion")

class Row(NamedTuple):
    """A queue row as the database returned it, normalised to Python types."""

    id: str
    correlation_id: str | None
    reply_to: str | None
    expires: dt.datetime | None
    headers: str
    body: bytes
    row_version: int
    expired: bool


#: A UUID in its canonical text form (lower case, dashes): kept as it is.
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def row_id(value: Any) -> str:
    """The Id column as text: a UUID in canonical form (the driver's UUID object, or text
    in any spelling), anything else as it is."""
    if type(value) is uuid.UUID:
        return str(value)
    if type(value) is str and _CANONICAL_UUID.fullmatch(value):
        return value
    return str(uuid.UUID(str(value))) if _is_uuid(value) else str(value)


def _is_uuid(value: Any) -> bool:
    if isinstance(value, uuid.UUID):
        return True
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True
