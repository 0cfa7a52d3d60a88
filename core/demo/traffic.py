"""Demo traffic for `make run`: a steady mix of Ping, FailOnce, Slow and the odd Fail."""
from __future__ import annotations

import itertools
import logging

from core.transport import Transport

log = logging.getLogger("sluice.demo")

#: One cycle of the mix: mostly Pings, a FailOnce, a short Slow, one Fail in twenty.
MIX = ["Ping"] * 14 + ["FailOnce", "FailOnce", "Slow", "Ping", "Ping", "Fail"]


class DemoTraffic:
    """A loop that sends ``rate`` demo messages per second to the demo queue."""

    name = "demo-traffic"

    def __init__(self, rate: float = 2.0, queue: str = "demo", using: str | None = None) -> None:
        if rate <= 0:
            raise ValueError("demo traffic rate must be positive")
        self.interval = 1.0 / rate
        self.queue = queue
        self.transport = Transport(using)
        self._types = itertools.cycle(MIX)
        self.sent = 0

    def step(self) -> float:
        kind = next(self._types)
        body = {"seconds": 0.2} if kind == "Slow" else {"n": self.sent}
        self.transport.send(self.queue, body, message_type=kind)
        self.sent += 1
        return self.interval

    def close(self) -> None:
        log.info("demo traffic sent %d messages", self.sent)
