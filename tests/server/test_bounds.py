"""Every resource the reference server holds is bounded, and each bound answers as
documented (issue 11): request heads (431, 408), bodies (408), sessions (eviction of the
least recently used idle one, else 503), streams per session (the oldest abandoned GET is
closed, else 429), retained event bytes per session, a connection's unsent backlog."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import sqlite3
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from lab.server.model import LiveConn
from tests.livesrv import reference_server
from tests.server.mcp_http import Mcp, messages

ADMIN = "admin-token-bounds"


def _raw(url: str, *chunks: bytes, wait: float = 5.0) -> bytes:
    """Send `chunks` on a fresh connection, one at a time, stopping as soon as the server
    answers; then what it answers until it closes (or `wait` passes)."""
    u = urlsplit(url)
    assert u.hostname is not None and u.port is not None
    with socket.create_connection((u.hostname, u.port), timeout=wait) as sock:
        for chunk in chunks:
            if select.select([sock], [], [], 0.02)[0]:
                break  # answered already: sending more would only earn a reset
            try:
                sock.sendall(chunk)
            except OSError:
                break
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            out += data
        return out


def _head(url: str, extra: str = "") -> bytes:
    u = urlsplit(url)
    return f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\n{extra}".encode()


@pytest.mark.live
def test_request_heads_and_bodies_are_bounded_in_size_and_time(tmp_path: Path) -> None:
    args = ("--max-header-bytes", "16384", "--header-timeout", "1", "--body-timeout", "1")
    with reference_server(tmp_path, *args) as srv:
        # An endless header: 431 once the head passes the bound, then the connection closes.
        t0 = time.monotonic()
        answer = _raw(srv.url, _head(srv.url, "x-big: "), *[b"a" * 8192] * 40)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
        assert time.monotonic() - t0 < 3
        # A head that stops arriving: 408 after the header timeout.
        t0 = time.monotonic()
        answer = _raw(srv.url, _head(srv.url, "x-slow: 1\r\n"))
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert 0.8 < time.monotonic() - t0 < 3
        # A connection that sends nothing at all is closed the same way.
        assert _raw(srv.url).startswith(b"HTTP/1.1 408 ")
        # A body that never ends: 408 after the body timeout.
        head = "content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
        t0 = time.monotonic()
        answer = _raw(srv.url, _head(srv.url, head + "content-length: 1000\r\n\r\n{"), b'"a": ')
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert 0.8 < time.monotonic() - t0 < 3
        # Ordinary requests are untouched by the bounds.
        m = Mcp(srv.url)
        assert m.initialize().status_code == 200
        _r, events = m.call("echo", {"text": "still fine"})
        assert messages(events)[-1]["result"]["content"][0]["text"] == "still fine"
        assert srv.proc.poll() is None


def _initialize_request(url: str) -> bytes:
    u = urlsplit(url)
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
    )
    return (
        f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\ncontent-type: application/json\r\n"
        f"accept: application/json, text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n{body}"
    ).encode()


@pytest.mark.live
def test_pipelined_requests_are_bounded_a_few_are_answered_a_flood_is_cut(tmp_path: Path) -> None:
    with reference_server(tmp_path, ledger=False) as srv:
        one = _initialize_request(srv.url)
        few = _raw(srv.url, one * 5, wait=2.0)
        assert few.count(b"HTTP/1.1 200 ") == 5  # honest pipelining is served, in order
        flood = _raw(srv.url, one * 200, wait=2.0)
        assert flood.count(b"HTTP/1.1 200 ") < 200  # the queue is cut, the connection closed
        assert srv.proc.poll() is None


@pytest.mark.live
def test_sessions_bounded_oldest_idle_evicted_then_503_when_all_busy(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--max-sessions", "3") as srv:
        clients = [Mcp(srv.url) for _ in range(3)]
        for c in clients:
            assert c.initialize().status_code == 200
        clients[0].call("echo", {"text": "0 used last"})  # 1 is now the least recently used
        newcomer = Mcp(srv.url)
        assert newcomer.initialize().status_code == 200
        assert clients[1].call("echo")[0].status_code == 404  # evicted
        assert clients[0].call("echo")[0].status_code == 200
        time.sleep(0.3)
        db = sqlite3.connect(tmp_path / "ledger.sqlite")
        reasons = [r[0] for r in db.execute("SELECT end_reason FROM sessions WHERE end_reason IS NOT NULL")]
        db.close()
        assert reasons == ["evicted"]
        # Every live session busy (a standalone stream open on each): no room, 503 + Retry-After.
        with ExitStack() as stack:
            for c in (clients[0], clients[2], newcomer):
                r, _ = stack.enter_context(c.stream("GET"))
                assert r.status_code == 200
            full = Mcp(srv.url).initialize()
            assert full.status_code == 503 and full.headers["retry-after"] == "1"


@pytest.mark.live
def test_streams_per_session_bounded_abandoned_gets_closed_then_429(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--max-session-streams", "2") as srv:
        m = Mcp(srv.url)
        m.initialize()
        for _ in range(5):  # open a standalone stream and walk away, five times
            with m.stream("GET") as (r, events):
                assert r.status_code == 200
                next(events)
        # The ledger writer batches its rows: wait (bounded) until the third close is in.
        deadline = time.monotonic() + 10.0
        while True:
            db = sqlite3.connect(tmp_path / "ledger.sqlite")
            closed = [r[0] for r in db.execute("SELECT close_reason FROM streams ORDER BY opened_at")]
            db.close()
            if closed == ["abandoned"] * 3 + [None, None] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert closed == ["abandoned"] * 3 + [None, None]
        with m.stream("GET") as (r1, _), m.stream("GET") as (r2, _):
            assert r1.status_code == r2.status_code == 200
            r3, _ = m.call("echo")
            assert r3.status_code == 429 and r3.headers["retry-after"] == "1"


@pytest.mark.live
def test_retained_events_bounded_in_bytes_older_cursors_rejected(tmp_path: Path) -> None:
    cap = 20_000
    with reference_server(
        tmp_path, "--max-session-event-bytes", str(cap), "--admin-token", ADMIN, ledger=False
    ) as srv:
        m = Mcp(srv.url)
        m.initialize()
        r, events = m.call("ticker", {"count": 2000, "interval_ms": 0})
        assert r.status_code == 200 and len(events) == 2002  # the live stream lost nothing
        stats = httpx.post(srv.url.replace("/mcp", "/lab-admin/stats"), headers={"x-lab-admin-token": ADMIN})
        retained = stats.json()["retained_event_bytes"]
        assert 0 < retained <= cap, retained
        # The priming event was dropped long ago: resuming from it is refused as evicted.
        with m.stream("GET", headers={"last-event-id": events[0].id or ""}) as (g, _):
            assert g.status_code == 400
            g.read()
            assert "evicted" in g.text
        # The newest events are still there: resuming from the last progress replays the response.
        with m.stream("GET", headers={"last-event-id": events[-2].id or ""}) as (g, stream):
            assert g.status_code == 200
            assert [e.data for e in stream] == [events[-1].data]


def test_a_connection_that_does_not_read_is_ended_not_buffered_forever() -> None:
    """LiveConn (pure): a backlog past its limit ends the connection as `slow_consumer`
    and frees the buffer; below the limit it buffers."""

    async def run() -> LiveConn:
        live = LiveConn("c1", limit=1000)
        for _ in range(9):
            live.push(b"x" * 100)
        assert not live.ended and live.pending_bytes == 900
        live.push(b"x" * 200)
        return live

    live = asyncio.run(run())
    assert live.ended and live.end_reason == "slow_consumer"
    assert live.pending == [] and live.pending_bytes == 0
