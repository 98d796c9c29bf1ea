"""Transport failures in the lab's words: the table, and real failures on 127.0.0.1."""

from __future__ import annotations

import errno
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from lab.drivers.causes import transport_cause
from lab.wire.errors import RemoteProtocolError as LabRemoteProtocolError


def raised_from(outer: Exception, inner: BaseException) -> Exception:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except Exception as e:
        return e


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (httpx.ReadTimeout("timed out"), "read_timeout"),
        (httpx.ConnectTimeout("timed out"), "connect_timeout"),
        (httpx.PoolTimeout("no connection"), "pool_timeout"),
        (httpx.WriteTimeout("timed out"), "write_timeout"),
        (
            raised_from(httpx.ConnectError("x"), ConnectionRefusedError(errno.ECONNREFUSED, "refused")),
            "connection_refused",
        ),
        (
            raised_from(httpx.ReadError("x"), ConnectionResetError(errno.ECONNRESET, "reset")),
            "connection_reset",
        ),
        (raised_from(httpx.WriteError("x"), BrokenPipeError(errno.EPIPE, "pipe")), "connection_reset"),
        (httpx.ReadError("something else"), "read_failed"),
        (httpx.ConnectError("name or service not known"), "connect_failed"),
        (
            httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body: received 3 bytes"
            ),
            "peer_closed_mid_body",
        ),
        (
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            "peer_closed_before_response",
        ),
        (httpx.RemoteProtocolError("illegal header line"), "protocol_error"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "connection_reset"),
        (OSError(errno.ECONNREFUSED, "refused"), "connection_refused"),
        (OSError(errno.EHOSTUNREACH, "unreachable"), "network_error"),
        (TimeoutError(), "read_timeout"),
        (RuntimeError("not a transport error"), "transport_error"),
    ],
)
def test_the_table(error: BaseException, cause: str) -> None:
    assert transport_cause(error) == cause


def test_a_class_name_never_leaks_into_a_cause() -> None:
    # httpx's RemoteProtocolError and the lab's share a name and mean different things.
    assert transport_cause(httpx.RemoteProtocolError("x")) != "RemoteProtocolError"
    assert transport_cause(LabRemoteProtocolError("x")) == "transport_error"


# -- real failures ------------------------------------------------------------------------


@contextmanager
def tcp_server(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """A one-connection TCP server on 127.0.0.1 doing `serve(conn)`; yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the request
            serve(conn)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        t.join(timeout=5)
        listener.close()


def fail(url: str, timeout: float = 5.0) -> str:
    with httpx.Client(timeout=timeout) as client:
        try:
            with client.stream("GET", url) as resp:
                for _ in resp.iter_raw():
                    pass
        except (httpx.HTTPError, OSError) as e:
            return transport_cause(e)
    raise AssertionError("the request did not fail")


def test_nothing_listening_is_connection_refused() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # the port is free and nothing listens on it
    assert fail(f"http://127.0.0.1:{port}/mcp") == "connection_refused"


def test_a_body_cut_short_is_peer_closed_mid_body() -> None:
    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")

    with tcp_server(serve) as url:
        assert fail(url) == "peer_closed_mid_body"


def test_a_close_before_the_head_is_peer_closed_before_response() -> None:
    with tcp_server(lambda conn: None) as url:
        assert fail(url) == "peer_closed_before_response"


def test_a_reset_mid_body_is_connection_reset() -> None:
    def serve(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST

    with tcp_server(serve) as url:
        assert fail(url) == "connection_reset"


def test_a_silent_peer_is_read_timeout() -> None:
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        done.wait(5)  # answer nothing

    with tcp_server(serve) as url:
        try:
            assert fail(url, timeout=0.3) == "read_timeout"
        finally:
            done.set()
