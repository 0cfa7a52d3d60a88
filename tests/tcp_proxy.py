"""A small threaded TCP proxy for fault-injection tests.

``TcpProxy(host, port)`` listens on 127.0.0.1 (an ephemeral port, ``proxy.port``)
and forwards every connection to ``host:port``.  :meth:`TcpProxy.cut` makes the
target unreachable: every open connection is reset and each new one is accepted
and reset at once (the client sees "connection reset" / "server closed the
connection unexpectedly" immediately — no hanging connects).  :meth:`TcpProxy.restore`
forwards again.  :meth:`TcpProxy.freeze` makes every open connection half-open: it
stays up but carries nothing more, either way, and is never reset (a peer or middlebox
gone silently); new connections are forwarded as usual.

Bounded: daemon threads only, every blocking call has a short timeout, and
:meth:`close` (or leaving the ``with`` block) stops the listener and every pipe::

    with TcpProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://u:p@127.0.0.1:{proxy.port}/db"
        ...
        proxy.cut(); ...; proxy.restore()
"""
from __future__ import annotations

import select
import socket
import struct
import threading
from typing import Optional

_POLL = 0.2  # seconds: how often blocked threads look at the stop flag
_CHUNK = 65536


def _reset(sock: Optional[socket.socket]) -> None:
    """Close ``sock`` with an RST (SO_LINGER 0), so the peer notices at once."""
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pipe:
    """One proxied connection: client ⇄ upstream, copied by one thread."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self._closed = threading.Event()
        #: Set by TcpProxy.freeze(): the connection stays open and carries nothing more.
        self.frozen = threading.Event()

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            _reset(self.client)
            _reset(self.upstream)

    def run(self, stopping: threading.Event) -> None:
        peers = {self.client: self.upstream, self.upstream: self.client}
        try:
            while not self._closed.is_set() and not stopping.is_set():
                if self.frozen.is_set():
                    stopping.wait(_POLL)
                    continue
                readable, _, broken = select.select(list(peers), [], list(peers), _POLL)
                if broken:
                    return
                if self.frozen.is_set():  # frozen while we waited: carry nothing
                    continue
                for sock in readable:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return  # a closed socket (cut, close, or the peer went away)
        finally:
            self.close()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` → ``target_host``:``target_port``; can cut the link."""

    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1",
                 connect_timeout: float = 5.0) -> None:
        self.target = (target_host, int(target_port))
        self.connect_timeout = connect_timeout
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(_POLL)
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._pipes: set[_Pipe] = set()
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._stopping = threading.Event()
        #: Counters, for assertions and diagnostics.
        self.accepted = 0  # connections forwarded
        self.refused = 0   # connections reset because the link was cut (or the target was down)
        self.killed = 0    # open connections reset by cut()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"tcp-proxy:{self.port}", daemon=True)
        self._acceptor.start()

    # -- control -----------------------------------------------------------------------------
    @property
    def is_cut(self) -> bool:
        return self._cut

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pipes)

    def cut(self) -> None:
        """Reset every open connection and refuse (accept-and-reset) new ones until restore()."""
        with self._lock:
            self._cut = True
            pipes, self._pipes = list(self._pipes), set()
            self.killed += len(pipes)
        for pipe in pipes:
            pipe.close()

    def freeze(self) -> None:
        """Make every open connection half-open: kept, never reset, carrying nothing more."""
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            pipe.frozen.set()

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        """Stop listening, reset every connection, and wait (briefly) for the threads."""
        self._stopping.set()
        self.cut()
        try:
            self._listener.close()
        except OSError:
            pass
        self._acceptor.join(2)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(2)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "cut" if self._cut else "forwarding"
        return f"<TcpProxy {self.host}:{self.port} → {self.target[0]}:{self.target[1]} {state}>"

    # -- the threads ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # listener closed
            client.settimeout(None)
            if self._cut:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=self.connect_timeout)
                upstream.settimeout(None)
            except OSError:
                self.refused += 1
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe = _Pipe(client, upstream)
            with self._lock:
                if self._cut or self._stopping.is_set():  # cut while we were connecting
                    self.refused += 1
                    pipe.close()
                    continue
                self._pipes.add(pipe)
                self.accepted += 1
                thread = threading.Thread(target=self._serve, args=(pipe,), name=f"tcp-proxy-pipe:{self.port}",
                                          daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
            thread.start()

    def _serve(self, pipe: _Pipe) -> None:
        try:
            pipe.run(self._stopping)
        finally:
            with self._lock:
                self._pipes.discard(pipe)
