"""One worker's loops: the pumps, the delayed mover, the alert evaluator, the queue sampler, the
outbox dispatcher and clean-up, the periodic clean-ups where no beat runs them (``maintenance``),
demo traffic and the health heartbeat, hosted in threads.  `sluice worker` and the Celery bootstep (workers/) both
use it, so a worker is the same thing however it is started."""
from __future__ import annotations

import logging
from typing import Any

from core.alerts.evaluator import AlertEvaluator
from core.alerts.notify import alerts_queue
from core.conf import get_settings
from core.delayed import DelayedMover
from core.demo.traffic import DemoTraffic
from core.handlers import handlers, load_handler_modules
from core.maintenance import MaintenanceLoop
from core.runtime.health import HealthPublisher
from core.runtime.loops import ThreadRunner
from core.outbox import OutboxDispatcher, worker_loops
from core.receive.pump import MessagePump
from core.monitoring.queue_samples import QueueSampler
from core.runtime import pauses
from core.queues import registry
from core.monitoring import gauges

log = logging.getLogger("sluice.worker")


class WorkerHost:
    def __init__(
        self,
        queues: list[str] | None = None,
        *,
        concurrency: int | None = None,
        mover: bool = True,
        demo_traffic: bool = False,
        redis_url: str | None = None,
        extra_loops: list[Any] | None = None,
        outbox_cleanup: bool = True,
        alerts: bool | None = None,
        maintenance: bool | None = False,
    ) -> None:
        load_handler_modules()
        settings = get_settings()
        self.queues = list(queues or handlers.queues())
        if not self.queues:
            raise ValueError("no queues to serve: register handlers (SLUICE_HANDLER_MODULES) or name queues")
        if settings.ALERTS_QUEUE in self.queues:
            alerts_queue()  # Sluice's own queue: made on first need
        for name in self.queues:
            registry.get(name)  # UnknownQueue → a clear error before any thread starts
        self.pumps = [MessagePump(name, concurrency=concurrency) for name in self.queues]
        gauges.observe(self.queues)  # tracing on: their length and oldest age as metrics
        loops: list[Any] = list(self.pumps)
        if mover:
            loops.append(DelayedMover())
        # Alerts are evaluated where the mover runs (``alerts`` decides otherwise); only the
        # evaluator holding the lease evaluates.
        if (mover and settings.ALERTS_ENABLED) if alerts is None else alerts:
            loops.append(AlertEvaluator())
        if mover:  # queue-length history for the monitoring tab; one sampler at a time (a lease)
            loops.append(QueueSampler())
        outbox_loops = [loop for loop in worker_loops()
                        if outbox_cleanup or isinstance(loop, OutboxDispatcher)]
        loops += outbox_loops
        self.dispatchers = [loop for loop in outbox_loops if isinstance(loop, OutboxDispatcher)]
        # No beat beside this worker (``sluice worker``): the periodic clean-ups run here, where
        # the mover runs (None), under the leases beat's tasks take.
        if mover if maintenance is None else maintenance:
            loops.append(MaintenanceLoop())
        if demo_traffic:
            loops.append(DemoTraffic(rate=settings.DEMO_RATE))
        loops += list(extra_loops or [])
        if redis_url:
            loops.append(HealthPublisher(redis_url, lambda: self.runner.snapshot(),
                                         processed=lambda: sum(p.stats.succeeded for p in self.pumps)))
        self.runner = ThreadRunner(loops)

    def start(self) -> "WorkerHost":
        self.runner.start()
        log.info("worker serving %s", ", ".join(self.queues))
        return self

    def stop(self, timeout: float = 30.0) -> bool:
        """Finish in-flight batches, then stop every loop; True when all stopped in time."""
        for pump in self.pumps:
            pump.stop()
        return self.runner.stop(timeout)

    def is_empty(self) -> bool:
        """Every served queue is empty (a paused one counts as done: its messages wait for
        the resume) and the outbox has nothing left to dispatch."""
        paused = pauses.paused_queues()
        return all(p.queue in paused or p.receiver.peek_estimate(p.queue) == 0 for p in self.pumps) \
            and not any(d.pending() for d in self.dispatchers)

    def summary(self) -> list[str]:
        return [f"{p.queue}: received {p.stats.received}, handled {p.stats.succeeded}, retried {p.stats.retried}, "
                f"to error {p.stats.errored}, expired {p.stats.expired}, poison {p.stats.poison}, "
                f"duplicates {p.stats.duplicates}" for p in self.pumps]
