"""A handler for the Celery outbox test (SLUICE_HANDLER_MODULES in its worker process):
a message on ``celery_relay`` publishes ``sluice.record_ping`` through the outbox."""
from __future__ import annotations

from core.handlers import handler
from workers.outbox import send_task_via_outbox

QUEUE = "celery_relay"


@handler(QUEUE)
def relay_to_celery(message, context) -> None:
    body = message.json()
    send_task_via_outbox(context, "sluice.record_ping", args=[body["ping"]], queue=body["celery_queue"])
