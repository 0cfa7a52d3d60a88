"""The four Redis commands worker health needs (SETEX, DEL, SCAN, MGET), spoken on one socket.

Why not redis-py: a worker that serves queues would load it for one SETEX every two
seconds, and redis-py 8 loads the OpenTelemetry SDK with it whenever that is installed,
tracing on or off: 6 MB of every worker's memory and a fifth of a second of its start.
These commands and their replies are a few lines of the protocol (RESP2, which every
Redis and Valkey speaks).

``REDIS_URL`` takes the forms redis-py documents for these parts: ``redis://[[user]:password@]
host[:port][/db]``, ``rediss://…`` (TLS; ``?ssl_cert_reqs=none`` skips the certificate
check, ``?ssl_ca_certs=PATH`` names the authority) and ``unix://[[user]:password@]/path
[?db=N]``; ``?db=N`` and ``?password=…`` work on each.
"""
from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class RedisReplyError(Exception):
    """Redis answered with an error (a wrong password, an unknown command)."""


@dataclass(frozen=True)
class RedisAddress:
    host: str = "localhost"
    port: int = 6379
    path: str = ""  # a Unix socket's path (host and port unused)
    db: int = 0
    username: str = ""
    password: str = ""
    tls: bool = False
    verify: bool = True
    ca_file: str = ""

    @classmethod
    def parse(cls, url: str) -> RedisAddress:
        """Raises ValueError naming what is wrong with ``url``."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"a Redis URL starts with redis://, rediss:// or unix://, not {url.split(':')[0]!r}")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        db_text = query.get("db") or (parts.path.strip("/") if parts.scheme != "unix" else "") or "0"
        if not db_text.isdigit():
            raise ValueError(f"the Redis database in {parts.scheme}://… must be a number, not {db_text!r}")
        common = {"db": int(db_text), "username": unquote(parts.username or ""),
                  "password": unquote(parts.password or query.get("password", ""))}
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// Redis URL needs the socket's path: unix:///run/redis/redis.sock")
            return cls(path=parts.path, **common)
        try:
            port = parts.port or 6379
        except ValueError as exc:
            raise ValueError(f"the Redis port in {parts.scheme}://… is not a port number ({exc})") from None
        return cls(host=parts.hostname or "localhost", port=port, tls=parts.scheme == "rediss",
                   verify=query.get("ssl_cert_reqs", "required").lower() not in ("none", "cert_none"),
                   ca_file=query.get("ssl_ca_certs", ""), **common)


class RedisWire:
    """One connection, opened on first use and again after any error; thread-safe (a command
    and its reply hold a lock).  Socket errors and timeouts raise ``OSError``, Redis's own
    errors :class:`RedisReplyError`."""

    def __init__(self, url: str, timeout: float = 0.5) -> None:
        self.address = RedisAddress.parse(url)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: Any = None

    # -- the commands ------------------------------------------------------------------------

    def setex(self, key: str, seconds: int, value: str | bytes) -> None:
        self.command("SETEX", key, seconds, value)

    def delete(self, key: str) -> None:
        self.command("DEL", key)

    def scan(self, match: str, count: int = 100) -> list[bytes]:
        """Every key matching ``match`` (SCAN's cursor followed to its end)."""
        keys: list[bytes] = []
        cursor = b"0"
        while True:
            cursor, found = self.command("SCAN", cursor, "MATCH", match, "COUNT", count)
            keys.extend(found)
            if cursor == b"0":
                return keys

    def mget(self, keys: list[bytes]) -> list[bytes | None]:
        return self.command("MGET", *keys) if keys else []

    def close(self) -> None:
        with self._lock:
            self._drop()

    # -- the protocol ----------------------------------------------------------------------

    def command(self, *args: Any) -> Any:
        with self._lock:
            try:
                if self._sock is None:
                    self._connect()
                self._send(args)
                return self._reply()
            except OSError:
                self._drop()  # a half-read reply must not be read by the next command
                raise

    def _connect(self) -> None:
        a = self.address
        if a.path:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(a.path)
            except OSError:
                sock.close()
                raise
        else:
            sock = socket.create_connection((a.host, a.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if a.tls:
                context = ssl.create_default_context(cafile=a.ca_file or None)
                if not a.verify:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=a.host)
        self._sock, self._reader = sock, sock.makefile("rb")
        try:
            if a.password:
                self._send(("AUTH", a.username, a.password) if a.username else ("AUTH", a.password))
                self._reply()
            if a.db:
                self._send(("SELECT", a.db))
                self._reply()
        except RedisReplyError:
            self._drop()
            raise

    def _send(self, args: tuple[Any, ...]) -> None:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        assert self._sock is not None
        self._sock.sendall(b"".join(parts))

    def _reply(self) -> Any:
        line = self._reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("Redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._reader.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionError("Redis closed the connection")
            return data[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise ConnectionError(f"not a Redis reply: {line[:40]!r}")

    def _drop(self) -> None:
        for closing in (self._reader, self._sock):
            try:
                if closing is not None:
                    closing.close()
            except OSError:
                pass
        self._sock = self._reader = None
