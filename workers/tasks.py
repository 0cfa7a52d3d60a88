"""Small Celery tasks of Sluice itself."""
from __future__ import annotations

from celery import shared_task


@shared_task(name="sluice.record_ping")
def record_ping(message_id: str) -> None:
    """Write one demo business row (sluice_demo_ping): proves a task really ran, once per row."""
    from core.demo.models import PingRecord

    PingRecord.objects.create(message_id=message_id)
