"""A small OTLP/HTTP receiver on 127.0.0.1: accepts every export and answers 200.

The transport benchmark exports its traced drain here, so the figure includes real
serialisation and HTTP round trips but no collector; the tests keep the request bodies
to decode them with ``opentelemetry-proto``.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class OtlpSink:
    """``with OtlpSink() as sink:`` → ``sink.endpoint`` (the OTEL_EXPORTER_OTLP_ENDPOINT
    value); ``keep=True`` keeps each request's path and body in ``sink.requests``."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.requests: list[tuple[str, bytes]] = []
        self.received = 0
        self.bytes = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with sink._lock:
                    sink.received += 1
                    sink.bytes += len(body)
                    if sink.keep:
                        sink.requests.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: one line per export would flood the benchmark's stderr

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-sink", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def bodies(self, path: str) -> list[bytes]:
        with self._lock:
            return [body for got, body in self.requests if got == path]

    def __enter__(self) -> "OtlpSink":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_until_stdin_closes() -> None:
    """``python -m benchmarks.otlp_sink``: a receiver in a process of its own (its CPU
    then counts against nobody's measurement); prints its endpoint, serves until its
    standard input closes."""
    import sys

    with OtlpSink() as sink:
        print(sink.endpoint, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    serve_until_stdin_closes()
