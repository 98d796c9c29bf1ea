"""lab.drivers.body: a response body read from its HTTP/1.1 connection gives what
`iter_raw()` gives — the same bytes, the same end, the same errors — against a real
server on 127.0.0.1 that answers each connection from a script (threads, no gevent).
If the installed httpx and httpcore stop taking the shallow path, the first test fails."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from lab.drivers.body import body_reader
from lab.drivers.causes import transport_cause

Step = bytes | float | None
"""What the server does next: send bytes, sleep seconds, or (None) close the connection."""

HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@contextmanager
def scripted_server(script: list[Step]) -> Iterator[str]:
    """A server that answers every request on every connection with `script`; its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        return
                    request += data
                for step in script:
                    if step is None:
                        return
                    if isinstance(step, float):
                        time.sleep(step)
                    else:
                        conn.sendall(step)

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)


def read_all(read: Callable[[], bytes | None]) -> list[bytes]:
    out = []
    while (data := read()) is not None:
        out.append(data)
    return out


def outcome(url: str, shallow: bool, read_timeout: float = 5.0) -> tuple[bytes, str | None, str, str]:
    """(body bytes, cause of the failure or None, the error's class and text) read one way
    or the other."""
    timeout = httpx.Timeout(5.0, read=read_timeout)
    with httpx.Client(timeout=timeout) as client:
        resp = client.send(client.build_request("GET", url), stream=True)
        got: list[bytes] = []
        try:
            if shallow:
                reader = body_reader(resp)
                assert reader is not None, "this httpx/httpcore no longer takes the shallow path"
                while (data := reader()) is not None:
                    got.append(data)
            else:
                got.extend(resp.iter_raw())
        except httpx.HTTPError as e:
            return b"".join(got), transport_cause(e), type(e).__name__, str(e)
        finally:
            resp.close()
    return b"".join(got), None, "", ""


def test_a_chunked_stream_reads_the_same_and_leaves_the_connection_reusable() -> None:
    script: list[Step] = [HEAD_CHUNKED, chunk(b"data: 1\n\n"), 0.05, chunk(b"data: 2\n\n"), b"0\r\n\r\n"]
    with scripted_server(script) as url:
        assert (
            outcome(url, shallow=True)
            == outcome(url, shallow=False)
            == (b"data: 1\n\ndata: 2\n\n", None, "", "")
        )
        with httpx.Client() as client:
            for _ in range(2):  # the second request goes out on the first one's connection
                resp = client.send(client.build_request("GET", url), stream=True)
                reader = body_reader(resp)
                assert reader is not None and read_all(reader) == [b"data: 1\n\n", b"data: 2\n\n"]
                resp.close()
            (conn,) = client._transport._pool.connections  # type: ignore[attr-defined]
            assert conn.is_idle()


@pytest.mark.parametrize(
    "script",
    [
        [b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n", b"hello", 0.05, b" world"],
        [b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n", b"until ", 0.05, b"the close", None],
    ],
    ids=["content-length", "close-delimited"],
)
def test_other_framings_read_the_same(script: list[Step]) -> None:
    with scripted_server(script) as url:
        shallow, deep = outcome(url, shallow=True), outcome(url, shallow=False)
        assert shallow == deep and shallow[1] is None and shallow[0] in (b"hello world", b"until the close")


def test_a_close_mid_body_is_the_same_failure() -> None:
    script: list[Step] = [HEAD_CHUNKED, chunk(b"data: 1\n\n"), None]
    with scripted_server(script) as url:
        shallow, deep = outcome(url, shallow=True), outcome(url, shallow=False)
    assert shallow == deep
    assert shallow[:3] == (b"data: 1\n\n", "peer_closed_mid_body", "RemoteProtocolError"), shallow


def test_a_silent_peer_is_the_same_read_timeout() -> None:
    script: list[Step] = [HEAD_CHUNKED, chunk(b"data: 1\n\n"), 3.0, b"0\r\n\r\n"]
    with scripted_server(script) as url:
        shallow = outcome(url, shallow=True, read_timeout=0.3)
        deep = outcome(url, shallow=False, read_timeout=0.3)
    assert shallow == deep
    assert shallow[:3] == (b"data: 1\n\n", "read_timeout", "ReadTimeout"), shallow


def test_a_response_not_on_an_http11_connection_is_left_to_iter_raw() -> None:
    client = httpx.Client(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, content=iter([b"x"])))
    )
    with client:
        resp = client.send(client.build_request("GET", "http://127.0.0.1:9/mcp"), stream=True)
        assert body_reader(resp) is None
        assert b"".join(resp.iter_raw()) == b"x"
        resp.close()
        assert body_reader(resp) is None  # closed: nothing to read
