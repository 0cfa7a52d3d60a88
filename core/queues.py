"""Queues: name rules, the registry, table creation and the per-queue model factory."""
from __future__ import annotations

import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, models, transaction
from django.db.models.functions import Now

from core.conf import get_settings
from core.dialects import Dialect, dialect_for
from core.errors import InvalidQueueName, InvalidTTL, UnknownQueue
from core.models import QueueKind, QueuePause, QueueRecord

log = logging.getLogger("sluice.queues")

MAX_NAME_LENGTH = 60
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
#: Prefixes of tables that belong to Django and Sluice itself.
RESERVED_PREFIXES = ("sluice_", "django_", "auth_")
DEAD_LETTER_SUFFIX = ".deadletter"
MIN_AUTO_DELETE_SECONDS = 300
MAX_TTL_SECONDS = 100 * 365 * 24 * 3600
#: Activity on a temporary queue is written at most this often per process (well under
#: MIN_AUTO_DELETE_SECONDS, so a queue in use never looks idle).
ACTIVITY_INTERVAL = 30.0


def validate_name(name: Any, *, own_table: bool = False) -> str:
    """The queue name if it is allowed; InvalidQueueName saying why otherwise.

    Names become table names.  They are always quoted in SQL as well, but a strict
    alphabet keeps them portable across SQLite, PostgreSQL (63-byte identifiers)
    and SQL Server, and readable in every tool.  ``own_table``: a table of Sluice's
    own (the delayed store), which may use the reserved ``sluice_`` prefix.
    """
    if not isinstance(name, str) or not name:
        raise InvalidQueueName("queue name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidQueueName(f"queue name is {len(name)} characters; at most {MAX_NAME_LENGTH} are allowed")
    if not NAME_RE.match(name):
        raise InvalidQueueName(
            f"queue name {name!r} may contain only letters, digits, '_', '.' and '-' "
            "(and must not start with '.' or '-')"
        )
    if not own_table and name.lower().startswith(RESERVED_PREFIXES):
        raise InvalidQueueName(f"queue name {name!r} uses a reserved prefix ({', '.join(RESERVED_PREFIXES)})")
    return name


def validate_ttl(ttl: Any, what: str = "TTL") -> float | None:
    """A TTL in seconds (float) or None; InvalidTTL for negatives, non-numbers, NaN."""
    if ttl is None:
        return None
    if isinstance(ttl, timedelta):
        ttl = ttl.total_seconds()
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        try:
            ttl = float(str(ttl).strip())
        except ValueError:
            raise InvalidTTL(f"{what} must be a number of seconds, not {ttl!r}") from None
    ttl = float(ttl)
    if math.isnan(ttl) or math.isinf(ttl):
        raise InvalidTTL(f"{what} must be a finite number of seconds")
    if ttl < 0:
        raise InvalidTTL(f"{what} must not be negative (got {ttl:g})")
    if ttl > MAX_TTL_SECONDS:
        raise InvalidTTL(f"{what} of {ttl:g} s is more than 100 years; leave it out for no expiry")
    return ttl


@dataclass(frozen=True)
class QueueInfo:
    """A queue's registry settings, as cached by one process."""

    name: str
    kind: str
    default_ttl_seconds: float | None
    dead_letter_on_expiry: bool
    dead_letter_queue: str | None
    auto_delete_on_idle_seconds: int | None
    #: The registry row's id: a queue deleted and made again is another table (its
    #: RowVersions start again), and so another key of core.runtime.marks.
    record_id: int | None = None

    @classmethod
    def of(cls, record: QueueRecord) -> "QueueInfo":
        return cls(record.name, record.kind, record.default_ttl_seconds, record.dead_letter_on_expiry,
                   record.dead_letter_queue, record.auto_delete_on_idle_seconds, record.pk)

    def effective_ttl(self, ttl: float | None) -> float | None:
        """The queue's default TTL is also a ceiling for the message's own."""
        if self.default_ttl_seconds is None:
            return ttl
        if ttl is None:
            return self.default_ttl_seconds
        return min(ttl, self.default_ttl_seconds)


class Registry:
    """Reads the queue registry, caching each queue's settings for a few seconds.

    Sends look up the TTL ceiling of their queue; caching keeps that off the hot path.
    Changes made in this process are visible at once; other processes' after the TTL.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, QueueInfo]] = {}
        self._touched: dict[tuple[str, str], float] = {}

    def get(self, name: str, using: str | None = None) -> QueueInfo:
        alias = using or get_settings().DATABASE
        key = (alias, name)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit and now - hit[0] < get_settings().REGISTRY_CACHE_SECONDS:
            return hit[1]
        record = QueueRecord.objects.using(alias).filter(name=name).first()
        if record is None:
            validate_name(name)
            raise UnknownQueue(f"queue {name!r} does not exist; create it with `sluice queue create {name}`")
        info = QueueInfo.of(record)
        with self._lock:
            self._cache[key] = (now, info)
        return info

    def forget(self, name: str | None = None) -> None:
        """Drop cached settings (and the activity throttle) for one queue or all."""
        with self._lock:
            if name is None:
                self._cache.clear()
                self._touched.clear()
            else:
                for key in [k for k in self._cache if k[1] == name]:
                    del self._cache[key]
                for key in [k for k in self._touched if k[1] == name]:
                    del self._touched[key]

    def record_activity(self, name: str, using: str | None = None) -> None:
        """Note activity on a queue that auto-deletes when idle.

        Every insert, receive, peek and browse calls this.  The registry row is written
        *after* the caller's transaction commits (at once outside one) and at most every
        :data:`ACTIVITY_INTERVAL` seconds per process: written inside a receive it would
        stay locked for the whole handler batch, serialising every process on the queue.
        A rolled-back transaction records nothing, which is right: nothing happened.
        """
        alias = using or get_settings().DATABASE
        info = self.get(name, alias)
        if info.auto_delete_on_idle_seconds is None:
            return
        key = (alias, info.name)
        now = time.monotonic()
        with self._lock:
            if now - self._touched.get(key, -1e9) < ACTIVITY_INTERVAL:
                return
            self._touched[key] = now
        transaction.on_commit(lambda: _write_activity(info.name, alias), using=alias, robust=True)


def _write_activity(name: str, alias: str) -> None:
    QueueRecord.objects.using(alias).filter(name=name).update(last_activity=Now())


registry = Registry()


def _alias(using: str | None) -> str:
    return using or get_settings().DATABASE


def dialect(using: str | None = None) -> Dialect:
    return dialect_for(connections[_alias(using)], get_settings().SCHEMA)


def create_queue(
    name: str,
    *,
    kind: str = QueueKind.NORMAL,
    ttl: Any = None,
    dead_letter_on_expiry: bool = False,
    auto_delete_on_idle: Any = None,
    using: str | None = None,
) -> tuple[QueueRecord, bool]:
    """Create a queue's table, indexes and registry row; idempotent and safe when several
    processes do it at once.  Returns (record, created).  Given settings are applied to
    an existing queue too."""
    validate_name(name)
    ttl = validate_ttl(ttl, "queue TTL")
    if kind not in QueueKind.values:
        raise ValueError(f"queue kind must be one of {', '.join(QueueKind.values)}")
    idle = None
    if auto_delete_on_idle is not None:
        idle = validate_ttl(auto_delete_on_idle, "auto-delete-on-idle")
        if idle < MIN_AUTO_DELETE_SECONDS:
            raise InvalidTTL(f"auto-delete-on-idle must be at least {MIN_AUTO_DELETE_SECONDS} s (5 minutes)")
        idle = int(idle)
        kind = QueueKind.TEMPORARY
    dlq = None
    if dead_letter_on_expiry:
        dlq = validate_name(name + DEAD_LETTER_SUFFIX)
    alias = _alias(using)
    d = dialect(alias)
    with transaction.atomic(using=alias):
        with connections[alias].cursor() as cursor:
            lock = d.ddl_lock()
            if lock:
                cursor.execute(*lock)
            for sql, params in d.create_queue_table(name):
                cursor.execute(sql, params)
        record, created = QueueRecord.objects.using(alias).get_or_create(
            name=name,
            defaults=dict(kind=kind, default_ttl_seconds=ttl, dead_letter_on_expiry=dead_letter_on_expiry,
                          dead_letter_queue=dlq, auto_delete_on_idle_seconds=idle, last_activity=Now()),
        )
        if not created:
            changes = {}
            if ttl is not None:
                changes["default_ttl_seconds"] = ttl
            if dead_letter_on_expiry:
                changes.update(dead_letter_on_expiry=True, dead_letter_queue=dlq)
            if idle is not None:
                changes.update(auto_delete_on_idle_seconds=idle, kind=QueueKind.TEMPORARY)
            if changes:
                QueueRecord.objects.using(alias).filter(pk=record.pk).update(**changes)
                record.refresh_from_db(using=alias)
    if dlq:
        create_queue(dlq, kind=QueueKind.DEAD_LETTER, using=alias)
    registry.forget(name)
    if created:
        log.info("created queue %s", name)
    return record, created


def ensure_queue_table(name: str, using: str | None = None) -> None:
    """Create the table of a registered queue if it is missing (no registry change)."""
    alias = _alias(using)
    d = dialect(alias)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        lock = d.ddl_lock()
        if lock:
            cursor.execute(*lock)
        for sql, params in d.create_queue_table(name):
            cursor.execute(sql, params)


def apply_table_upkeep(using: str | None = None) -> list[str]:
    """Give every registered queue's table the dialect's storage settings
    (:meth:`Dialect.table_upkeep`: PostgreSQL's autovacuum thresholds), for tables made
    before Sluice set them; ``sluice setup`` runs it.  Idempotent, and nothing where the
    dialect has none.  Returns the queues it went over."""
    alias = _alias(using)
    d = dialect(alias)
    if not d.supports_table_upkeep:
        return []
    names = sorted(QueueRecord.objects.using(alias).values_list("name", flat=True))
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        lock = d.ddl_lock()
        if lock:
            cursor.execute(*lock)
        for name in names:
            for sql, params in d.table_upkeep(name):
                cursor.execute(sql, params)
        active = d.table_upkeep_active()
        if active is not None:
            cursor.execute(*active)
            if not cursor.fetchone()[0]:
                log.warning("autovacuum is off on this database server: queue tables pile up dead rows "
                            "until someone runs VACUUM; turn it on (autovacuum = on in postgresql.conf)")
    return names


def delete_queue(name: str, using: str | None = None) -> None:
    """Drop a queue's table and registry row (its messages are gone)."""
    validate_name(name)
    alias = _alias(using)
    d = dialect(alias)
    if not QueueRecord.objects.using(alias).filter(name=name).exists():
        raise UnknownQueue(f"queue {name!r} does not exist")
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        lock = d.ddl_lock()
        if lock:
            cursor.execute(*lock)
        for sql, params in d.drop_queue_table(name):
            cursor.execute(sql, params)
        QueueRecord.objects.using(alias).filter(name=name).delete()
        QueuePause.objects.using(alias).filter(queue=name).delete()  # a new queue of that name runs
    registry.forget(name)
    log.info("deleted queue %s", name)


def missing_indexes(name: str, using: str | None = None) -> list[str]:
    """Names of the indexes a queue table should have and lacks (logged as warnings)."""
    alias = _alias(using)
    d = dialect(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(*d.existing_indexes(name))
        present = {row[0] for row in cursor.fetchall()}
    wanted = d.index_names(name)
    if d.rowversion_is_primary_key:
        wanted.pop("rowversion")
    missing = [idx for idx in wanted.values() if idx not in present]
    if missing:
        statements = [sql for sql, _ in d.create_queue_table(name) if "INDEX" in sql]
        log.warning("queue %s is missing index(es) %s; create them with: %s",
                    name, ", ".join(missing), "; ".join(statements))
    return missing


def list_queues(using: str | None = None) -> list[QueueRecord]:
    return list(QueueRecord.objects.using(_alias(using)).all())


_models: dict[tuple[str, str], type[models.Model]] = {}
_models_lock = threading.Lock()


def queue_model(name: str, using: str | None = None) -> type[models.Model]:
    """An unmanaged Django model for a queue table, made from one definition.

    For reading queue rows through the ORM (the dashboard, ad-hoc queries).  Sending and
    receiving go through core.transport, whose SQL the dialects own.  With
    ``SLUICE_SCHEMA`` the table is the schema-qualified one of ``using``'s dialect (Django
    leaves an already quoted name as it is); without, the bare name, so the model
    compiles for any connection.
    """
    validate_name(name)
    table = dialect(using).table(name) if get_settings().SCHEMA else name
    with _models_lock:
        if (name, table) in _models:
            return _models[(name, table)]
        safe = re.sub(r"[^A-Za-z0-9]", "_", name)
        attrs = {
            "__module__": __name__,
            "row_version": models.BigIntegerField(primary_key=True, db_column="RowVersion"),
            "message_id": models.CharField(max_length=36, db_column="Id"),
            "correlation_id": models.CharField(max_length=255, null=True, db_column="CorrelationId"),
            "reply_to_address": models.CharField(max_length=255, null=True, db_column="ReplyToAddress"),
            "recoverable": models.BooleanField(default=True, db_column="Recoverable"),
            "expires": models.DateTimeField(null=True, db_column="Expires"),
            "headers": models.TextField(db_column="Headers"),
            "body": models.BinaryField(null=True, db_column="Body"),
            "Meta": type("Meta", (), {"managed": False, "db_table": table, "app_label": "sluice",
                                      "ordering": ["row_version"]}),
        }
        model = type(f"QueueTable_{safe}_{len(_models)}", (models.Model,), attrs)
        _models[(name, table)] = model
        return model
