"""The sync driver closes idle connections whose keep-alive ran out (httpcore would only on
the client's next request), and never one in use. A real HTTP/1.1 server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

from lab.drivers.sync import close_idle_connections, default_client


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, idle_timeout: float | None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.idle_timeout = idle_timeout
        self.opened = 0
        self.ended = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_ended(self, n: int, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ended >= n:
                return True
            time.sleep(0.01)
        return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server: Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)  # the server's own idle limit, if any
        with self.server.lock:
            self.server.opened += 1

    def finish(self) -> None:
        super().finish()
        with self.server.lock:
            self.server.ended += 1  # the connection is over on the server's side

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"first", b"second"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(0.4)
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def server(idle_timeout: float | None = None) -> Iterator[Server]:
    srv = Server(idle_timeout)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_idle_connection_is_closed_once_its_keep_alive_ran_out() -> None:
    with server() as srv, default_client(keepalive=0.3) as client:
        assert client.get(srv.url).status_code == 200
        assert close_idle_connections(client) == 1  # within its keep-alive: kept
        time.sleep(0.2)
        assert srv.ended == 0
        time.sleep(0.3)
        assert close_idle_connections(client) == 0
        assert srv.wait_ended(1)  # the server saw it close
        assert client.get(srv.url).status_code == 200  # the pool goes on, on a new connection
        assert srv.opened == 2


def test_a_connection_the_server_closed_is_closed_here_too() -> None:
    # Within the keep-alive, but the server gave up on it: the descriptor is released now,
    # not at the client's next request.
    with server(idle_timeout=0.2) as srv, default_client(keepalive=60.0) as client:
        assert client.get(srv.url).status_code == 200
        assert srv.wait_ended(1)
        time.sleep(0.05)
        assert close_idle_connections(client) == 0
        (conn,) = client._transport._pool.connections  # type: ignore[attr-defined]
        assert conn.is_closed()


def test_a_connection_in_use_is_never_closed() -> None:
    with server() as srv, default_client(keepalive=0.01) as client:
        with client.stream("GET", srv.url + "/slow") as resp:
            chunks = resp.iter_bytes()
            assert next(chunks) == b"first"
            time.sleep(0.1)  # any keep-alive would have run out: only being in use protects it
            assert close_idle_connections(client) == 0
            assert b"".join(chunks) == b"second"  # the stream went on to its end
        assert srv.opened == 1


def test_a_client_on_another_transport_is_left_alone() -> None:
    class Wrapped(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport(limits=httpx.Limits(keepalive_expiry=0.01))

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return self.inner.handle_request(request)

        def close(self) -> None:
            self.inner.close()

    with server() as srv, httpx.Client(transport=Wrapped()) as client:
        assert client.get(srv.url).status_code == 200
        time.sleep(0.1)
        assert close_idle_connections(client) == 0
        time.sleep(0.2)
        assert srv.ended == 0  # not ours to close: httpcore's own rule applies
