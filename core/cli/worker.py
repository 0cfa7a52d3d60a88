"""`sluice worker` (the loops in this process) and `sluice status` (every worker's health)."""
from __future__ import annotations

import json
import signal
import socket
import threading
from typing import Any

from core.conf import get_settings

from core.cli.base import CommandError, Group, command_group
from core.runtime.health import TTL_SECONDS, read_health
from core.startup import refusal, settle_heap
from core.worker import WorkerHost


@command_group
class WorkerCommands(Group):
    def add_to(self, sub) -> None:
        worker = self.handles(sub.add_parser("worker", help="run the message pumps in this process (Ctrl-C stops)"),
                              self.worker)
        worker.add_argument("--queue", action="append", default=[], dest="queues",
                            help="queue to serve (repeatable); default: every queue with a handler")
        worker.add_argument("--concurrency", type=int)
        worker.add_argument("--demo-traffic", action="store_true",
                            help="also send demo messages to the demo queue (SLUICE_DEMO_RATE per second)")
        worker.add_argument("--until-empty", action="store_true",
                            help="exit once every served queue is empty and the outbox has nothing to dispatch")
        worker.add_argument("--no-mover", action="store_true",
                            help="do not run the delayed-message mover in this worker")
        worker.add_argument("--no-maintenance", action="store_true",
                            help="leave the periodic clean-ups (expired-message purge, idle queues, error "
                                 "ingestion, archived-failure purge, Django tasks' old results) to Celery beat; "
                                 "they run where the mover runs unless this is given")

        status = self.handles(sub.add_parser("status", help="workers, their loops and circuit breakers (from Redis)"),
                              self.status)
        status.add_argument("--json", action="store_true")
        status.add_argument("--check", action="store_true",
                            help="exit non-zero unless a worker on this host publishes its heartbeat with every "
                                 "loop alive (a container health check)")
        status.add_argument("--host", help="with --check: the worker's host name (default: this machine's)")

    def worker(self, options: dict[str, Any]) -> None:
        refused = refusal("the worker (sluice worker)")
        if refused:
            raise CommandError(refused)
        host = WorkerHost(options["queues"], concurrency=options["concurrency"], mover=not options["no_mover"],
                          demo_traffic=options["demo_traffic"], redis_url=get_settings().REDIS_URL,
                          maintenance=False if options["no_maintenance"] else None)
        stop = threading.Event()

        def request_stop(signum, frame) -> None:
            if stop.is_set():  # a second signal: leave now; open transactions roll back
                raise SystemExit(1)
            self.stderr.write("stopping: finishing in-flight messages (signal again to abort)")
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        settle_heap()  # as web and Celery processes do: full collections skip start-up's objects
        host.start()
        self.stdout.write(f"worker serving {', '.join(host.queues)}; Ctrl-C stops")
        self.stdout.flush()
        try:
            while not stop.is_set():
                stop.wait(0.2)
                if options["until_empty"] and host.is_empty():
                    break
        finally:
            host.stop()
        for line in host.summary():
            self.stdout.write(line)

    def status(self, options: dict[str, Any]) -> None:
        health = read_health(get_settings().REDIS_URL)
        if options["check"]:
            self.check_host(health, options["host"] or socket.gethostname())
            return
        if options["json"]:
            self.stdout.write(json.dumps(health))
            return
        self.stdout.write(f"redis: {health['redis']}" + (f" ({health['error']})" if health.get("error") else ""))
        if not health["workers"]:
            self.stdout.write("no workers seen in the last 15 s")
        for w in health["workers"]:
            self.stdout.write(f"worker {w['name']} (last seen {w['last_seen']})")
            for loop in w["loops"]:
                self.stdout.write(f"  loop {loop['name']:40} {'alive' if loop['alive'] else 'DEAD':5} "
                                  f"steps {loop['steps']} errors {loop['errors']}")
            for b in w["breakers"]:
                self.stdout.write(f"  breaker {b['name']:37} {b['state']}"
                                  + (f"  {b['last_error']}" if b["state"] != "closed" else ""))

    def check_host(self, health: dict[str, Any], host: str) -> None:
        """`status --check`: this host's workers are alive (heartbeat names are ``<host>:<pid>``)."""
        if health["redis"] != "up":
            raise CommandError(f"redis is down ({health.get('error', '')}): no heartbeats to read")
        mine = [w for w in health["workers"] if w["name"].rpartition(":")[0] == host]
        if not mine:
            raise CommandError(f"no worker on {host} published a heartbeat in the last {TTL_SECONDS} s")
        dead = [f"{w['name']} {loop['name']}" for w in mine for loop in w["loops"] if not loop["alive"]]
        if dead:
            raise CommandError(f"dead loops: {', '.join(dead)}")
        self.stdout.write(f"ok: {len(mine)} worker(s) on {host}, every loop alive")
