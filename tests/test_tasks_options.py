"""Sluice's own per-task options through the framework's task class (core.tasks.backend.
SluiceTask): ``@task(ttl=…, immediate_retries=…, delayed_retries=…)`` on Django 5.2 (the
backport) and 6.1 alike — a task's retry counts in place of the worker's, its message's TTL,
and a clear error for each bad value."""
from __future__ import annotations

import dataclasses
import time

import pytest

from core.delayed import SqlDelayedStore
from core.tasks.framework import InvalidTaskError, TaskResultStatus
from core.transport import Transport
from tests.conftest import drain
from tests.tasks_support import tasks_on_sluice  # noqa: F401


def run_all(pump_for, setup, **options) -> None:
    drain(pump_for(setup.queue, concurrency=1, **options))


def test_a_task_s_own_retry_counts_replace_the_worker_s(tasks_on_sluice, pump_for, error_queue):
    from tests import task_option_funcs as funcs

    plain, once = funcs.fails.enqueue(), funcs.fails_retried_once.enqueue()
    run_all(pump_for, tasks_on_sluice, immediate_retries=3)  # the worker's: 3 immediate retries
    plain, once = plain.task.get_result(plain.id), once.task.get_result(once.id)
    assert plain.status == once.status == TaskResultStatus.FAILED
    assert (plain.attempts, len(plain.errors)) == (4, 4)  # the worker's count: 1 + 3
    assert (once.attempts, len(once.errors)) == (2, 2)    # the task's own: 1 + 1
    assert "attempt 2 fails" in once.errors[-1].traceback
    assert {m.id for m in Transport().browse(error_queue)} == {plain.id, once.id}


def test_a_task_s_delayed_retries_apply_where_the_worker_has_none(tasks_on_sluice, pump_for, error_queue):
    from tests import task_option_funcs as funcs

    SqlDelayedStore().setup_infrastructure()
    result = funcs.fails_into_a_delayed_retry.enqueue()
    run_all(pump_for, tasks_on_sluice, immediate_retries=3, delayed_retries=0)
    done = result.task.get_result(result.id)
    # Retries remain (the task's one delayed retry, none immediate): READY after one error,
    # waiting in the delayed store for its queue, not in the error queue.
    assert done.status == TaskResultStatus.READY and len(done.errors) == 1
    assert Transport().browse(error_queue) == []
    waiting, _ = SqlDelayedStore().list(bodies=False)
    assert [m.destination for m in waiting if m.headers.get("NServiceBus.MessageId") == result.id] == \
        [tasks_on_sluice.queue]


def test_a_task_s_ttl_is_its_message_s(tasks_on_sluice, pump_for):
    from tests import task_option_funcs as funcs

    kept = dataclasses.replace(funcs.short_lived, ttl=None).enqueue(1)
    expiring = funcs.short_lived.enqueue(2)
    by_id = {m.id: m for m in Transport().browse(tasks_on_sluice.queue)}
    assert by_id[expiring.id].expires is not None and by_id[kept.id].expires is None
    time.sleep(1.0)  # past the 0.5 s TTL, by any clock
    run_all(pump_for, tasks_on_sluice)
    assert funcs.short_lived.get_result(kept.id).return_value == 1
    # Expired unreceived: never run, its result still READY with no attempt.
    never = funcs.short_lived.get_result(expiring.id)
    assert never.status == TaskResultStatus.READY and never.attempts == 0
    assert Transport().browse(tasks_on_sluice.queue) == []


@pytest.mark.parametrize("options, error", [
    ({"ttl": -1}, "ttl must not be negative"),
    ({"ttl": 0}, "ttl must be more than 0 seconds"),
    ({"ttl": "soon"}, "ttl must be a number of seconds"),
    ({"immediate_retries": -1}, "immediate_retries must be a whole number >= 0"),
    ({"delayed_retries": "2"}, "delayed_retries must be a whole number >= 0"),
    ({"immediate_retries": True}, "immediate_retries must be a whole number >= 0"),
])
def test_bad_options_are_refused_at_declaration(tasks_on_sluice, options, error):
    from core.tasks.framework import task_backends
    from tests import task_option_funcs as funcs

    declare = task_backends["default"].task_class
    with pytest.raises(InvalidTaskError, match=error):
        declare(func=funcs.short_lived.func, backend="default", queue_name="default", priority=0,
                takes_context=False, **options)
    with pytest.raises(InvalidTaskError, match=error):
        dataclasses.replace(funcs.short_lived, **options)


def test_an_unknown_option_is_the_framework_s_type_error(tasks_on_sluice):
    from tests import task_option_funcs as funcs

    try:
        from django.tasks import task
    except ImportError:
        from django_tasks import task
    with pytest.raises(TypeError):
        task(retries=3)(funcs.short_lived.func)
    variant = funcs.fails_retried_once.using(queue_name="default")
    assert variant.immediate_retries == 1 and variant.ttl is None
