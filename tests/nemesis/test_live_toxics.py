"""Each toxic, measured on the wire: the real nemesis in front of a real upstream on
127.0.0.1, driven through toxiproxy-python. Timing assertions are lower bounds with wide
margins (noise only ever makes things slower), except where a toxic must *not* act."""

from __future__ import annotations

import time

import pytest
import requests

from lab.nemesis.client import ToxiproxyClient
from lab.nemesis.toxics import make_toxic
from tests.nemesis.conftest import NemesisProcess, ProxyFactory, listen_port
from tests.nemesis.upstreams import (
    TcpServer,
    bulk,
    connect,
    echo,
    median_round_trip,
    read_events,
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
