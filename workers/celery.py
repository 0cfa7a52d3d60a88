"""The Celery app: Redis broker from REDIS_URL (via Django settings).

The periodic loops and the bootsteps that host core's loops are added with the Celery
issue; until then `sluice worker` hosts the pumps in threads (core.loops.ThreadRunner).
"""
from __future__ import annotations

import os

import django
from celery import Celery
from django.apps import apps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sluice.settings")
# Set up once: a running Django process that publishes outbox tasks has done it already.
if not apps.ready:
    django.setup()

from django.conf import settings  # noqa: E402  (after django.setup)

app = Celery("sluice")
app.conf.update(
    broker_url=settings.REDIS_URL,
    result_backend=settings.REDIS_URL,
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    timezone="UTC",
    beat_schedule={},
)
app.autodiscover_tasks(["workers"], related_name="tasks", force=True)
