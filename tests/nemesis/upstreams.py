"""Small upstream servers and socket clients for the nemesis tests (plain sockets and
threads: the test process never imports trio).

Each server listens on 127.0.0.1 with a free port, serves every connection in its own
thread, and stops (accept loop and handlers) when its `with` block ends.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

Handler = Callable[[socket.socket, threading.Event], None]

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"


class TcpServer:
    """A threaded TCP server on 127.0.0.1; `handler(conn, stopping)` runs per connection."""

    def __init__(self, handler: Handler, *, max_connections: int = 200) -> None:
        self._handler = handler
        self._max = max_connections
        self._stopping = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port: int = self._sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []

    def __enter__(self) -> Self:
        accept = threading.Thread(target=self._accept_loop, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._sock.close()
        for conn in list(self._conns):  # wake handlers blocked in recv
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in list(self._threads):
            t.join(timeout=5)

    def _accept_loop(self) -> None:
        for _ in range(self._max):  # at most max_connections, then the server stops accepting
            conn = None
            while conn is None and not self._stopping.is_set():
                try:
                    conn, _ = self._sock.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
            if conn is None:
                return
            self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            with contextlib.suppress(OSError):
                self._handler(conn, self._stopping)


def echo(conn: socket.socket, stopping: threading.Event) -> None:
    """Send back whatever arrives, until EOF."""
    for _ in range(100_000):
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def sse(events: int = 100, interval: float = 0.05, head: bytes = SSE_HEAD) -> Handler:
    """After a request head, an HTTP response (`head`) of `events` SSE events, `interval` s apart."""

    def handler(conn: socket.socket, stopping: threading.Event) -> None:
        read_head(conn)
        conn.sendall(head)
        for i in range(events):
            if stopping.is_set():
                return
            conn.sendall(f"id: {i}\ndata: event number {i}\n\n".encode())
            time.sleep(interval)
        close_gently(conn)

    return handler


def recorder(received: list[bytes]) -> Handler:
    """Keep everything that arrives on each connection (one entry per connection, at EOF)."""

    def handler(conn: socket.socket, stopping: threading.Event) -> None:
        data = b""
        for _ in range(100_000):
            try:
                chunk = conn.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        received.append(data)

    return handler


def bulk(payload: bytes) -> Handler:
    """Send `payload` at once, then close."""

    def handler(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(payload)
        close_gently(conn)

    return handler


def read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


def close_gently(conn: socket.socket) -> None:
    """FIN, then wait for the peer's close, so unread data never turns the close into RST."""
    conn.shutdown(socket.SHUT_WR)
    conn.settimeout(5)
    for _ in range(1000):
        if not conn.recv(65536):
            return


# -- clients ------------------------------------------------------------------------------


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def round_trip(sock: socket.socket, message: bytes = b"ping") -> float:
    """Seconds from sending `message` to having it back."""
    start = time.monotonic()
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"EOF after {got!r}")
        got += chunk
    assert got == message
    return time.monotonic() - start


def median_round_trip(sock: socket.socket, n: int = 3) -> float:
    return statistics.median(round_trip(sock) for _ in range(n))


@dataclass
class Received:
    """What a client read until the connection ended (or its deadline passed)."""

    data: bytes = b""
    reads: list[int] = field(default_factory=list)
    eof_at: float | None = None  # time.monotonic() of the clean EOF
    error: OSError | None = None  # e.g. ConnectionResetError

    @property
    def events(self) -> int:
        return self.data.count(b"\n\n")


def read_until_end(sock: socket.socket, *, within: float = 10.0, into: Received | None = None) -> Received:
    """Read until EOF, an error, or `within` seconds (then neither eof_at nor error is set)."""
    out = into if into is not None else Received()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError as exc:
            out.error = exc
            break
        if not chunk:
            out.eof_at = time.monotonic()
            break
        out.data += chunk
        out.reads.append(len(chunk))
    return out


def read_events(sock: socket.socket, count: int, *, within: float = 5.0) -> Received:
    """Read until `count` SSE events have arrived."""
    out = Received()
    deadline = time.monotonic() + within
    while out.events < count and time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"EOF after {out.events} events")
        out.data += chunk
        out.reads.append(len(chunk))
    assert out.events >= count, f"only {out.events} events within {within}s"
    return out
