"""The monitoring tab tests' data: a queue a real pump handled, its length sampled."""
from __future__ import annotations

import pytest

from core import failures
from core.monitoring.queue_samples import sample_now
from core.transport import Transport
from tests.conftest import drain


@pytest.fixture
def busy_queue(make_queue, pump_for, temp_handlers, error_queue):
    """A queue a real pump handled: 6 PlaceOrder (one of them always fails: retried once, then
    to the error queue and ingested) and 3 ShipOrder; its length sampled."""
    queue = make_queue("mon")

    def handle(message, context):
        if message.json().get("fail"):
            raise ValueError("bad order")

    temp_handlers(queue, "PlaceOrder", handle)
    temp_handlers(queue, "ShipOrder", handle)
    transport = Transport()
    for i in range(5):
        transport.send(queue, {"order": i}, message_type="PlaceOrder")
    transport.send(queue, {"fail": True}, message_type="PlaceOrder")
    for i in range(3):
        transport.send(queue, {"order": i}, message_type="ShipOrder")
    drain(pump_for(queue, immediate_retries=1))
    failures.ingest_errors()
    transport.send(queue, {"order": 99}, message_type="PlaceOrder")  # one waiting: the sampled length
    sample_now()
    return queue
