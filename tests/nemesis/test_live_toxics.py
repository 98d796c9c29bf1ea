"""Each toxic, measured on the wire: the real nemesis in front of a real upstream on
127.0.0.1, driven through toxiproxy-python. Timing assertions are lower bounds with wide
margins (noise only ever makes things slower), except where a toxic must *not* act."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from lab.nemesis.client import ToxiproxyClient
from lab.nemesis.toxics import ToxicSpec, make_toxic
from tests.nemesis.conftest import NemesisProcess, ProxyFactory, listen_port
from tests.nemesis.upstreams import (
    SSE_HEAD,
    Handler,
    TcpServer,
    bulk,
    close_gently,
    connect,
    echo,
    median_round_trip,
    read_events,
    read_head,
    read_until_end,
    recorder,
    round_trip,
    sse,
)

pytestmark = pytest.mark.live

SSE_REQUEST = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"


def test_latency_is_added_to_a_live_connection(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        with connect(port) as s:
            before = median_round_trip(s)
            client.add_toxic(make_proxy.names[0], make_toxic("latency", latency=200))
            with_latency = median_round_trip(s)  # the same connection: toxics act on live ones
            client.remove_toxic(make_proxy.names[0], "latency_downstream")
            after = median_round_trip(s)
    assert with_latency - before >= 0.150, (before, with_latency)
    assert with_latency - after >= 0.150, (after, with_latency)


def test_latency_upstream_delays_the_request(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(
            make_proxy.names[0], make_toxic("latency", stream="upstream", latency=200, jitter=20)
        )
        with connect(port) as s:
            rtt = median_round_trip(s)
    assert rtt >= 0.150


def test_reset_peer_cuts_a_live_sse_stream(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(sse(events=100, interval=0.05)) as up:
        port = listen_port(make_proxy(up.port))
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            got = read_events(s, 3)  # the stream is live
            client.add_toxic(make_proxy.names[0], make_toxic("reset_peer", timeout=100))
            read_until_end(s, within=5, into=got)
    assert isinstance(got.error, ConnectionResetError), (got.error, got.eof_at)
    assert 3 <= got.events < 100, "the stream must be cut in the middle"
    assert [r.type for r in nemesis.records(make_proxy.names[0])][-1] == "toxic_added"


def test_limit_data_cuts_a_stream_after_n_bytes(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(sse(events=100, interval=0.02)) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(make_proxy.names[0], make_toxic("limit_data", bytes=500))
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            got = read_until_end(s, within=5)
    assert got.error is None and got.eof_at is not None, "a clean close (FIN), not a reset"
    assert len(got.data) == 500
    assert got.data.startswith(b"HTTP/1.1 200 OK")
    assert 1 <= got.events < 100


def test_limit_data_upstream_cuts_the_request(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    received: list[bytes] = []
    with TcpServer(recorder(received)) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(make_proxy.names[0], make_toxic("limit_data", stream="upstream", bytes=10))
        with connect(port) as s:
            s.sendall(b"0123456789abcdefghij")
            got = read_until_end(s, within=5)
        assert got.eof_at is not None, got.error
        deadline = time.monotonic() + 5
        while not received and time.monotonic() < deadline:
            time.sleep(0.02)
    assert received == [b"0123456789"], "the server got the first 10 bytes, then the close"


def test_bandwidth_caps_the_rate(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    payload = bytes(range(256)) * 120  # 30,720 bytes
    with TcpServer(bulk(payload)) as up:
        port = listen_port(make_proxy(up.port))
        start = time.monotonic()
        with connect(port) as s:
            fast = read_until_end(s)
        fast_s = time.monotonic() - start
        client.add_toxic(make_proxy.names[0], make_toxic("bandwidth", rate=20))  # 20 KB/s: about 1.5 s
        start = time.monotonic()
        with connect(port) as s:
            slow = read_until_end(s)
        slow_s = time.monotonic() - start
    assert fast.data == payload and slow.data == payload
    assert slow_s >= 1.1, (fast_s, slow_s)
    assert slow_s > fast_s + 0.5


def test_slicer_cuts_data_into_small_delayed_pieces(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    payload = b"x" * 20_000
    with TcpServer(bulk(payload)) as up:
        port = listen_port(make_proxy(up.port))
        with connect(port) as s:
            whole = read_until_end(s)
        client.add_toxic(
            make_proxy.names[0], make_toxic("slicer", average_size=100, size_variation=20, delay=2000)
        )
        with connect(port) as s:
            sliced = read_until_end(s)
    assert whole.data == payload and sliced.data == payload
    # About 200 slices 2 ms apart; a busy box may merge some in the socket buffer.
    assert len(sliced.reads) >= 40, sliced.reads[:20]
    assert len(sliced.reads) > 4 * len(whole.reads)
    assert min(sliced.reads) <= 120


def test_slow_close_delays_the_end_of_the_stream(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(bulk(b"hello")) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(make_proxy.names[0], make_toxic("slow_close", delay=600))
        with connect(port) as s:
            s.settimeout(5)
            first = s.recv(5)
            got_data = time.monotonic()
            rest = read_until_end(s)
    assert first == b"hello" and rest.data == b""
    assert rest.eof_at is not None
    assert rest.eof_at - got_data >= 0.45


def test_timeout_drops_data_then_closes(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(make_proxy.names[0], make_toxic("timeout", timeout=500))
        start = time.monotonic()
        with connect(port) as s:
            s.sendall(b"ping")
            got = read_until_end(s, within=5)
    assert got.data == b"", "the echo must be dropped"
    assert got.eof_at is not None, got.error
    assert got.eof_at - start >= 0.4


def test_timeout_zero_holds_until_removed(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        name = make_proxy.names[0]
        client.add_toxic(name, make_toxic("timeout", timeout=0))
        with connect(port) as s:
            s.sendall(b"ping")
            held = read_until_end(s, within=1.0)
            assert held.data == b"" and held.eof_at is None and held.error is None, "no data, still open"
            client.remove_toxic(name, "timeout_downstream")
            ended = read_until_end(s, within=5)
        assert ended.eof_at is not None, "removing a timeout toxic closes the connections it held"
        with connect(port) as s:
            assert round_trip(s) < 5  # and new connections flow again


def test_toxicity_zero_never_applies_and_removal_is_the_way(
    client: ToxiproxyClient, make_proxy: ProxyFactory, nemesis: NemesisProcess
) -> None:
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        name = make_proxy.names[0]
        with pytest.raises(ValueError, match="toxicity 0"):
            client.add_toxic(name, make_toxic("latency", latency=1000, toxicity=0.0))
        zero = '{"type": "latency", "name": "slow", "toxicity": 0.0, "attributes": {"latency": 1000}}'
        # toxiproxy-python does send toxicity 0; the nemesis takes it, as Toxiproxy does
        sent = requests.post(f"{nemesis.url}/proxies/{name}/toxics", data=zero, timeout=5)
        assert sent.status_code == 200, sent.text
        assert client.toxics(name)["slow"].toxicity == 0.0
        with connect(port) as s:
            unaffected = median_round_trip(s)
        client.update_toxic(name, make_toxic("latency", name="slow", latency=1000, toxicity=1.0))
        with connect(port) as s:
            affected = median_round_trip(s)
        client.remove_toxic(name, "slow")
        assert "slow" not in client.toxics(name)
        with connect(port) as s:
            removed = median_round_trip(s)
    assert affected >= 0.8
    assert unaffected < 0.5 and removed < 0.5, (unaffected, removed)
    kinds = [(r.type, r.toxicity) for r in nemesis.records(name) if r.toxic == "slow"]
    assert kinds == [
        ("toxic_added", 0.0),
        ("toxic_removed", 0.0),
        ("toxic_added", 1.0),
        ("toxic_removed", 1.0),
    ]


def test_a_disabled_proxy_refuses_connections(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        info = make_proxy(up.port)
        port = listen_port(info)
        with connect(port) as live:
            round_trip(live)
            client.set_enabled(info.name, False)
            dropped = read_until_end(live, within=5)
            assert dropped.eof_at is not None or dropped.error is not None, "its connections are dropped"
        with pytest.raises(ConnectionRefusedError):
            connect(port).close()
        client.set_enabled(info.name, True)
        with connect(port) as s:
            assert round_trip(s) < 5


def test_idle_timeout_closes_a_connection_only_once_it_is_silent(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    # A proxy's read timeout: while the server side talks at least every 100 ms the
    # connection lives past three timeouts of 400 ms; once it falls silent, it is closed
    # (FIN) about 400 ms after the last byte.
    with TcpServer(echo) as up:
        port = listen_port(make_proxy(up.port))
        client.add_toxic(make_proxy.names[0], make_toxic("idle_timeout", timeout=400))
        with connect(port) as s:
            for i in range(12):  # 1.2 s of traffic, 100 ms apart
                if i:
                    time.sleep(0.1)
                assert round_trip(s) < 1.0
            # Silent from the last byte the server side sent (the echo just read): the
            # timeout counts from there, not from after a pause of the test's own.
            silent_from = time.monotonic()
            got = read_until_end(s, within=5)
    assert got.data == b"" and got.eof_at is not None, got.error
    assert 0.3 <= got.eof_at - silent_from <= 3.0, got.eof_at - silent_from


def _arrivals(s: socket.socket, within: float) -> list[tuple[float, bytes]]:
    """(seconds since the call, bytes) of each read until EOF or `within` seconds."""
    start, out = time.monotonic(), []
    while (left := within - (time.monotonic() - start)) > 0:
        s.settimeout(max(0.01, left))
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        out.append((time.monotonic() - start, chunk))
    return out


def _one_answer(
    client: ToxiproxyClient, make_proxy: ProxyFactory, upstream: Handler, toxic: ToxicSpec, within: float = 5
) -> list[tuple[float, bytes]]:
    """One request through a new proxy of the nemesis with `toxic` on it, to `upstream`:
    what arrived and when (`_arrivals`)."""
    with TcpServer(upstream) as up:
        port = listen_port(make_proxy(up.port, f"_{len(make_proxy.names)}"))
        client.add_toxic(make_proxy.names[-1], toxic)
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            return _arrivals(s, within)


def _events(arrived: list[tuple[float, bytes]]) -> int:
    return b"".join(c for _, c in arrived).count(b"\n\n")


def test_idle_timeout_cuts_an_sse_stream_that_pauses(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    # Events 0.6 s apart through a 300 ms idle timeout: the stream ends after the first
    # event(s), as a CDN ends a quiet SSE stream; events 50 ms apart pass untouched.
    idle = make_toxic("idle_timeout", timeout=300)
    start = time.monotonic()
    cut = _one_answer(client, make_proxy, sse(events=5, interval=0.6), idle)
    assert 1 <= _events(cut) < 5 and time.monotonic() - start < 2.5, (_events(cut), cut)
    whole = _one_answer(client, make_proxy, sse(events=20, interval=0.05), idle)
    assert _events(whole) == 20, _events(whole)


def test_buffer_holds_sse_events_until_its_size_or_its_flush(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    # Events of ~30 bytes every 50 ms. By size (300 bytes): what arrives comes in pieces of
    # 300 bytes or more (the last one, at the end of the stream, excepted). By time (no size
    # reached, a 400 ms flush): nothing before about 400 ms, then batches of several events.
    events = sse(events=20, interval=0.05)
    by_size = _one_answer(client, make_proxy, events, make_toxic("buffer", size=300, flush=0))
    assert _events(by_size) == 20
    assert all(len(c) >= 300 for _, c in by_size[:-1]) and len(by_size) >= 2, [len(c) for _, c in by_size]
    by_time = _one_answer(client, make_proxy, events, make_toxic("buffer", size=1_000_000, flush=400))
    assert _events(by_time) == 20
    assert by_time[0][0] >= 0.3, by_time[0][0]
    assert max(c.count(b"\n\n") for _, c in by_time) >= 4, [c.count(b"\n\n") for _, c in by_time]


def test_buffer_lets_go_when_removed_and_never_holds_a_no_buffering_answer(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    with TcpServer(sse(events=40, interval=0.05)) as up:  # 2 s of events; the stream stays open
        port = listen_port(make_proxy(up.port))
        name = make_proxy.names[0]
        client.add_toxic(name, make_toxic("buffer", size=1_000_000, flush=0))
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            held = _arrivals(s, 0.8)  # 15 events or so were sent meanwhile, and held
            client.remove_toxic(name, "buffer_downstream")
            released = _arrivals(s, 4)
    assert held == [], held
    assert released and released[0][0] < 0.3 and released[0][1].count(b"\n\n") >= 10, released[:1]
    assert b"".join(c for _, c in released).count(b"\n\n") == 40
    # The server asks proxies not to buffer (nginx's header): every event goes on at once.
    head = SSE_HEAD.replace(b"\r\n\r\n", b"\r\nX-Accel-Buffering: no\r\n\r\n")
    big = make_toxic("buffer", size=1_000_000, flush=0)
    unbuffered = _one_answer(client, make_proxy, sse(events=5, interval=0.1, head=head), big, within=3)
    assert unbuffered[0][0] < 0.3 and len(unbuffered) >= 3, [(round(t, 2), len(c)) for t, c in unbuffered]


def _late_first_event(conn: socket.socket, stopping: threading.Event) -> None:
    """An SSE answer whose first event comes 0.6 s after its head."""
    read_head(conn)
    conn.sendall(SSE_HEAD)
    time.sleep(0.6)
    conn.sendall(b"id: 1\ndata: late\n\n")
    close_gently(conn)


def test_header_hold_sends_the_head_only_with_the_first_body_byte(
    client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    # Without the toxic the head comes at once; with it, nothing comes before the first
    # event, and then the head and the event together.
    with TcpServer(_late_first_event) as up:
        port = listen_port(make_proxy(up.port))
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            plain = _arrivals(s, 3)
        client.add_toxic(make_proxy.names[0], make_toxic("header_hold"))
        with connect(port) as s:
            s.sendall(SSE_REQUEST)
            held = _arrivals(s, 3)
    assert plain[0][0] < 0.4 and plain[0][1] == SSE_HEAD, plain
    assert held[0][0] >= 0.5 and held[0][1].startswith(SSE_HEAD + b"id: 1"), held


def _json_then_wait(conn: socket.socket, stopping: threading.Event) -> None:
    """A complete JSON answer; the connection then stays open (kept alive)."""
    read_head(conn)
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {}}'
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    stopping.wait(3)


def test_buffer_lets_a_complete_answer_go_at_once(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    # A buffering proxy passes a short answer when it is complete, not when its buffer fills.
    big = make_toxic("buffer", size=1_000_000, flush=0)
    got = _one_answer(client, make_proxy, _json_then_wait, big, within=1.0)
    assert got and got[0][0] < 0.5 and got[0][1].endswith(b'"result": {}}'), got
