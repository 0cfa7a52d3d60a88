"""The transport's statements run on the Django connection (same transaction), through a
cursor that binds on the server and prepares the hot statements where the database can
(PostgreSQL), and behaves as Django's cursor does otherwise: Django's errors, a broken
transaction refused, execute wrappers run, queries logged."""
from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import override_settings

from core.db import StatementCursor
from core.dialects import dialect_for


def prepared_statements() -> list[str]:
    """The statements prepared on this connection's session (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.postgresql
def test_receive_peek_and_insert_are_prepared_on_the_connection(transport, queue):
    connection.close()  # a fresh session: nothing prepared yet
    transport.send_many(queue, ["a", "b", "c"])
    transport.peek_estimate(queue)
    with transaction.atomic():
        assert [m.body for m in transport.receive_batch(queue, 10)] == [b"a", b"b", b"c"]
    statements = [s for s in prepared_statements() if queue in s]
    assert any(s.startswith("INSERT INTO") for s in statements)
    assert any(s.startswith("DELETE FROM") and "RETURNING" in s for s in statements)
    assert dialect_for(connection).peek_estimate(queue) in statements
    transport.send(queue, "again")  # a prepared statement is reused, not prepared again
    with transaction.atomic():
        assert [m.body for m in transport.receive_batch(queue, 10)] == [b"again"]
    # + the 1-row INSERT, and the receive from the queue's mark (core.runtime.marks)
    grown = [s for s in prepared_statements() if queue in s]
    assert len(grown) == len(statements) + 2
    assert any('"RowVersion" >= $1' in s for s in grown)
    transport.send(queue, "once more")
    with transaction.atomic():
        assert [m.body for m in transport.receive_batch(queue, 10)] == [b"once more"]
    assert len([s for s in prepared_statements() if queue in s]) == len(grown)


@pytest.mark.postgresql
def test_prepared_statements_can_be_turned_off(transport, queue):
    with override_settings(SLUICE_PREPARED_STATEMENTS=False):
        connection.close()
        transport.send_many(queue, ["a", "b"])
        transport.peek_estimate(queue)
        with transaction.atomic():
            assert len(transport.receive_batch(queue, 10)) == 2
        assert [s for s in prepared_statements() if queue in s] == []


def test_a_failed_statement_raises_djangos_error_and_a_broken_transaction_is_refused(transactional_db):
    with transaction.atomic(), StatementCursor("default") as cursor:
        with pytest.raises(DatabaseError):
            with transaction.atomic(savepoint=False):  # marks the whole transaction for rollback
                cursor.execute("SELECT * FROM sluice_no_such_table")
        with pytest.raises(TransactionManagementError):  # as Django's cursor refuses it
            cursor.execute("SELECT 1")


def test_execute_wrappers_see_the_transports_statements(transport, queue):
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        transport.send_many(queue, ["a", "b"])
        with transaction.atomic():
            assert len(transport.receive_batch(queue, 10)) == 2
    assert any(sql.startswith("INSERT INTO") and queue in sql for sql in seen)
    assert any(sql.startswith("DELETE FROM") and queue in sql for sql in seen)


def test_statements_run_in_the_connections_transaction(transport, queue):
    with pytest.raises(RuntimeError), transaction.atomic():
        transport.send_many(queue, ["a", "b"])
        assert transport.counts(queue).total == 2
        raise RuntimeError("roll back")
    assert transport.counts(queue).total == 0


@pytest.mark.postgresql
def test_a_copy_runs_in_the_transaction_through_the_wrappers_and_refuses_unsendable_text_before_it_starts(
        transactional_db):
    """COPY … FROM STDIN (the processing records' write on PostgreSQL) is one statement of
    the connection's transaction: execute wrappers see it, a rollback takes its rows back,
    and a value the driver cannot send raises ValueError with nothing sent, so the
    transaction goes on."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS pg_temp.sluice_copy_probe")
        cursor.execute("CREATE TEMPORARY TABLE sluice_copy_probe (n bigint, t varchar(20))")
    copy = "COPY sluice_copy_probe (n, t) FROM STDIN"
    with pytest.raises(RuntimeError), transaction.atomic(), StatementCursor("default") as cursor:
        cursor.copy_in(copy, [(1, "one"), (2, None)])
        raise RuntimeError("roll back")
    with transaction.atomic(), connection.execute_wrapper(wrapper), StatementCursor("default") as cursor:
        for unsendable in ("nul\x00", "half \ud800 pair"):
            with pytest.raises(ValueError):
                cursor.copy_in(copy, [(3, "fine"), (4, unsendable)])
        cursor.copy_in(copy, [(5, "tab\tand\nnewline"), (6, None)])
    assert seen == [copy]
    with connection.cursor() as cursor:
        cursor.execute("SELECT n, t FROM sluice_copy_probe ORDER BY n")
        assert cursor.fetchall() == [(5, "tab\tand\nnewline"), (6, None)]
