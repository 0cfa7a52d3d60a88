"""Queue names, the registry, table creation (idempotent, concurrent) and index checks."""
from __future__ import annotations

import logging
import threading

import pytest
from django.db import connection

from core.errors import InvalidQueueName, InvalidTTL, UnknownQueue
from core.models import QueueRecord
from core.queues import create_queue, delete_queue, dialect, missing_indexes, queue_model, validate_name
from core.transport import Transport


@pytest.mark.parametrize("name", [
    "", "a'b", 'a"b', "a;drop table x", "a b", "x" * 61, "-leading", ".leading", "a]b", "sluice_queue",
    "django_session", None, 42,
])
def test_invalid_queue_names_are_refused(name):
    with pytest.raises(InvalidQueueName):
        validate_name(name)


@pytest.mark.parametrize("name", ["orders", "Samples.SqlServer.Endpoint", "error", "a-b_c.d", "x" * 60])
def test_valid_queue_names(name):
    assert validate_name(name) == name


def test_create_is_idempotent_and_applies_settings(make_queue):
    name = make_queue()
    record, created = create_queue(name, ttl=120)
    assert created is False and record.default_ttl_seconds == 120
    assert QueueRecord.objects.filter(name=name).count() == 1


def test_invalid_name_writes_nothing(transactional_db):
    with pytest.raises(InvalidQueueName):
        create_queue("bad;name")
    assert not QueueRecord.objects.filter(name="bad;name").exists()


@pytest.mark.parametrize("ttl", [-5, "abc", float("nan")])
def test_invalid_queue_ttl_writes_nothing(transactional_db, ttl):
    with pytest.raises(InvalidTTL):
        create_queue("ttlcheck", ttl=ttl)
    assert not QueueRecord.objects.filter(name="ttlcheck").exists()


def test_auto_delete_on_idle_has_a_five_minute_minimum(transactional_db):
    with pytest.raises(InvalidTTL, match="300"):
        create_queue("tmpq", auto_delete_on_idle=60)


def test_temporary_queue_records_activity(make_queue):
    name = make_queue(auto_delete_on_idle=300)
    record = QueueRecord.objects.get(name=name)
    assert record.kind == "temporary" and record.auto_delete_on_idle_seconds == 300
    assert record.last_activity is not None


def test_dead_letter_on_expiry_creates_the_dead_letter_queue(make_queue):
    name = make_queue(dead_letter_on_expiry=True)
    dlq = QueueRecord.objects.get(name=name + ".deadletter")
    assert dlq.kind == "dead_letter"
    assert QueueRecord.objects.get(name=name).dead_letter_queue == dlq.name


def test_concurrent_creation_from_many_threads(transactional_db):
    name = "racing_queue"
    errors: list[BaseException] = []

    def create() -> None:
        try:
            create_queue(name)
        except BaseException as exc:  # noqa: BLE001 — collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert QueueRecord.objects.filter(name=name).count() == 1
        Transport().send(name, "works")
    finally:
        delete_queue(name)


def test_delete_queue_drops_table_and_registry_row(transactional_db):
    create_queue("short_lived")
    delete_queue("short_lived")
    assert not QueueRecord.objects.filter(name="short_lived").exists()
    d = dialect()
    with connection.cursor() as cursor:
        cursor.execute(*d.table_exists("short_lived"))
        assert cursor.fetchone() is None
    with pytest.raises(UnknownQueue):
        delete_queue("short_lived")


def test_a_missing_index_is_reported_as_a_warning(queue, caplog):
    assert missing_indexes(queue) == []
    d = dialect()
    name = d.index_names(queue)["expires"]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {d.quote(name)}", [])
    with caplog.at_level(logging.WARNING, logger="sluice.queues"):
        assert missing_indexes(queue) == [name]
    assert "missing index" in caplog.text and "CREATE INDEX" in caplog.text


def test_each_queue_table_has_a_django_model(transport, queue):
    transport.send(queue, "a", message_type="A")
    transport.send(queue, "b", message_type="B", ttl=60)
    model = queue_model(queue)
    assert model is queue_model(queue)  # one class per queue
    rows = list(model.objects.all())
    assert [bytes(r.body) for r in rows] == [b"a", b"b"]
    assert rows[0].expires is None and rows[1].expires is not None
    assert model._meta.managed is False


@pytest.mark.row_locking
def test_a_receive_transaction_does_not_hold_the_registry_row(make_queue):
    """Defect 10: activity on a temporary queue is recorded after the receive commits, so
    the registry row is never locked across a handler batch."""
    import threading

    from django.db import connection, transaction
    from core.models import QueueRecord
    from core.queues import registry

    name = make_queue(auto_delete_on_idle=300)
    Transport().send(name, "x")
    registry.forget()  # cache and activity throttle: the receive below records activity
    registry._touched.clear()
    outcome: list[str] = []
    with transaction.atomic():
        assert Transport().receive_batch(name, 10)

        def other() -> None:
            try:
                with transaction.atomic():
                    QueueRecord.objects.select_for_update(nowait=True).get(name=name)
                outcome.append("free")
            except Exception as exc:  # noqa: BLE001 — the lock error is the finding
                outcome.append(type(exc).__name__)
            finally:
                connection.close()

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert outcome == ["free"]
    last = QueueRecord.objects.get(name=name).last_activity
    assert last is not None  # and it was recorded, after the commit


@pytest.mark.postgresql
def test_queue_model_reads_the_table_in_the_configured_schema(transactional_db, settings):
    """Defect 11: with SLUICE_SCHEMA the queue tables live in that schema; the ORM model
    must read them there."""
    import uuid

    settings.SLUICE_SCHEMA = f"sluice_s_{uuid.uuid4().hex[:6]}"
    name = f"q_{uuid.uuid4().hex[:10]}"
    create_queue(name)
    try:
        Transport().send(name, "in a schema")
        model = queue_model(name)
        assert [row.body.tobytes() if hasattr(row.body, "tobytes") else bytes(row.body)
                for row in model.objects.all()] == [b"in a schema"]
    finally:
        delete_queue(name)
        with connection.cursor() as cursor:
            cursor.execute(f'DROP SCHEMA IF EXISTS "{settings.SLUICE_SCHEMA}" CASCADE')
