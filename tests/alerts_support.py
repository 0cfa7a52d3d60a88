"""Real receivers for alert notifications: an HTTP server and an SMTP server (aiosmtpd) on
127.0.0.1, free ports, stopped by the tests; and helpers that run the alerts queue's pump."""
from __future__ import annotations

import json
import socket
import uuid
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from core.models.alerts import AlertRule, AlertTarget
from core.conf import get_settings
from tests.conftest import wait_for  # noqa: F401 (the tests import it from here)


class WebhookReceiver:
    """Answers POSTs from a script of (status, headers) — the last one repeats — and keeps
    every request: (monotonic time, path, headers, parsed JSON body).  A status of None
    never answers: the request hangs until the receiver stops (a target gone silent).
    ``on_request(body)``, when given, runs while the request is open, before the answer."""

    def __init__(self, script: list[tuple[int | None, dict[str, str]]] | None = None,
                 on_request: Any = None) -> None:
        self.script = list(script or [(200, {})])
        self.requests: list[tuple[float, str, dict[str, str], Any]] = []
        self.on_request = on_request
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.requests.append((time.monotonic(), self.path, dict(self.headers), json.loads(raw)))
                    status, headers = receiver.script[min(len(receiver.requests), len(receiver.script)) - 1]
                if receiver.on_request is not None:
                    receiver.on_request(json.loads(raw))
                if status is None:
                    receiver._stopping.wait(60)
                    return
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token-abc123"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r[3] for r in self.requests]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpReceiver:
    """An aiosmtpd server on 127.0.0.1 keeping every message it receives."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[tuple[str, list[str], str]] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802
                receiver.messages.append((envelope.mail_from, list(envelope.rcpt_tos),
                                          envelope.content.decode("utf-8", "replace")))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> "SmtpReceiver":
        self.controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.controller.stop()


def alerts_worker(**options: Any):
    """A real worker (thread runner) serving the alerts queue, with the delayed mover (for
    delivery retries); the alert evaluator off unless asked."""
    from core.alerts.delivery import register
    from core.worker import WorkerHost

    register()
    options.setdefault("alerts", False)
    return WorkerHost([get_settings().ALERTS_QUEUE], **options).start()


def served_until(status: str, timeout: float = 30):
    """Serve the alerts queue (:func:`alerts_worker`) until a delivery reaches ``status``;
    returns that delivery."""
    from core.models.alerts import AlertDelivery

    host = alerts_worker()
    try:
        return wait_for(lambda: AlertDelivery.objects.filter(status=status).first(), timeout=timeout)
    finally:
        host.stop()


@pytest.fixture
def own_alerts_queue(settings, transactional_db):
    """An alerts queue of the test's own (queue tables outlive the test database's flush)."""
    from core.models import DelayedMessageRow
    from core.queues import delete_queue
    from core.scheduling import delayed_store

    delayed_store().setup_infrastructure()  # delivery retries are delayed messages
    name = settings.SLUICE_ALERTS_QUEUE = f"alerts_{uuid.uuid4().hex[:10]}"
    yield name
    # Each attempt leaves a check message due at its deadline (core.alerts.delivery); the
    # delayed store outlives the test database's flush, and the queue goes now.
    DelayedMessageRow.objects.filter(destination=name).delete()
    try:
        delete_queue(name)
    except Exception:  # noqa: BLE001 — never made
        pass


def rule(kind: str, **fields) -> AlertRule:
    """A rule that resolves after one clear evaluation (unless told otherwise)."""
    fields.setdefault("clear_after", 1)
    return AlertRule.objects.create(name=fields.pop("name", kind), kind=kind, **fields)


def states(r: AlertRule) -> list[str]:
    return list(r.alerts.order_by("id").values_list("state", flat=True))


@pytest.fixture
def target(transactional_db):
    # Nothing listens: notifications stay queued (these tests look at alerts, not delivery).
    return AlertTarget.objects.create(name="hook", url="http://127.0.0.1:9/hook")
