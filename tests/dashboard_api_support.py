"""Helpers of the JSON API, action, audit and metrics tests: clients for each role, the
Redis list the workers' Celery queue lives in, and running a queued bulk operation the way
the worker's task does."""
from __future__ import annotations

import base64
import json

import pytest
import redis
from django.conf import settings
from django.test import Client

from core.failures import run_operation
from dashboard.actions.operations import TASK_QUEUE
from tests.dashboard_pages_support import make_user


def api(client: Client, method: str, path: str, data=None, **extra):
    """A JSON request; returns (status, parsed body)."""
    kwargs = {"content_type": "application/json"} if data is not None else {}
    body = json.dumps(data) if data is not None and not isinstance(data, str) else data
    response = getattr(client, method)(path, body, **kwargs, **extra) if data is not None \
        else getattr(client, method)(path, **extra)
    assert response["Content-Type"].startswith("application/json"), response.content[:300]
    return response.status_code, response.json()


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def queued_operations() -> list[int]:
    """Operation ids of the bulk-operation tasks waiting in the workers' Celery queue."""
    ids = []
    for raw in broker().lrange(TASK_QUEUE, 0, -1):
        message = json.loads(raw)
        if message.get("headers", {}).get("task") == "sluice.run_bulk_operation":
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))  # Celery protocol 2
            ids.append(int(args[0]))
    return ids


def run_queued(operation_id: int):
    """Do what the worker's task does with the queued operation (the task is in Redis)."""
    assert operation_id in queued_operations(), "the operation was not handed to the workers"
    return run_operation(operation_id)


@pytest.fixture
def clean_broker():
    broker().delete(TASK_QUEUE)
    yield
    broker().delete(TASK_QUEUE)


@pytest.fixture
def nobody_client(transactional_db) -> Client:
    """Logged in, but in no Sluice group."""
    client = Client()
    client.force_login(make_user(None))
    return client
