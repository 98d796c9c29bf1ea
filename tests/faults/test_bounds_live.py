"""A target whose response head never ends must not take the proxy's memory: mitmdump
(with the tap, as every run starts it) gives up the head past its bound
(`mcp_faults_io.bound_response_heads`), answers its client 502 and closes the target's
connection, long before the target has sent what it would have."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest
from mcp_faults_io import MAX_RESPONSE_HEAD

from tests.faults.live import tap_proxy

pytestmark = pytest.mark.live

ENDLESS = 64 * 1024 * 1024
"""What the target would send as headers if no one stopped it (bytes)."""


class EndlessHeads:
    """One connection at a time: read the request, then headers without end; counts what
    it could send before the proxy closed the connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.sent: list[int] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(30)  # a proxy that stops reading without closing: the test ends
            conn.recv(65536)
            sent = conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
            line = b"X-Endless: " + b"a" * 1000 + b"\r\n"
            try:
                while sent < ENDLESS:
                    conn.sendall(line)
                    sent += len(line)
            except OSError:
                pass  # the proxy closed it: what we wanted to see
            self.sent.append(sent)


def test_a_response_head_that_never_ends_is_cut_at_the_bound(tmp_path: Path) -> None:
    target = EndlessHeads()
    with tap_proxy(tmp_path, f"http://127.0.0.1:{target.port}", tmp_path / "tap.jsonl") as px:
        r = httpx.get(px.url, timeout=45)
        target.thread.join(45)
    assert r.status_code == 502, r.text
    assert "over the limit" in r.text
    (sent,) = target.sent
    # Closed near the bound (the socket buffers hold a few MiB more), never all of it.
    assert MAX_RESPONSE_HEAD < sent < ENDLESS // 4, sent
