"""A connection leaves the nemesis's fast path only while a toxic acts on it, and comes
back to it once none does: in process, a real proxy on 127.0.0.1 in front of a trio echo
server, the link's `toxic_spells` read directly."""

from __future__ import annotations

import random

import trio

from lab.nemesis.proxy import Proxy
from lab.nemesis.proxyspec import Address, ProxyConfig
from lab.nemesis.toxics import make_toxic


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(4096):
            await stream.send_all(data)


async def _round_trip(stream: trio.SocketStream, payload: bytes) -> bytes:
    await stream.send_all(payload)
    got = b""
    with trio.fail_after(5):
        while len(got) < len(payload):
            got += await stream.receive_some(4096)
    return got


def _run_proxy_test(body: object) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, _echo, 0)
            up_port = listeners[0].socket.getsockname()[1]
            proxy = Proxy(
                ProxyConfig("echo", Address("127.0.0.1", 0), Address("127.0.0.1", up_port)),
                random.Random(1),
            )
            await proxy.start(nursery)
            client = await trio.open_tcp_stream("127.0.0.1", proxy.config.listen.port)
            async with client:
                await body(proxy, client)  # type: ignore[operator]
            await proxy.stop()
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_connection_returns_to_the_fast_path_when_its_toxic_is_removed() -> None:
    async def body(proxy: Proxy, client: trio.SocketStream) -> None:
        assert await _round_trip(client, b"clean") == b"clean"
        (link,) = proxy._links
        assert link.toxic_spells == {}
        proxy.toxics.add(make_toxic("latency", latency=20))
        assert await _round_trip(client, b"slow") == b"slow"
        assert link.toxic_spells == {"downstream": 1}
        proxy.remove_toxic("latency_downstream")
        # The reader notices at its next read: the first chunk after the removal still goes
        # through the (now empty) queue, the ones after it through the fast path.
        for i in range(3):
            assert await _round_trip(client, b"after %d" % i) == b"after %d" % i
        proxy.toxics.add(make_toxic("latency", latency=20))
        assert await _round_trip(client, b"slow again") == b"slow again"
        # A second spell: the direction had left the queued path (it used to stay on it
        # for the rest of the connection's life).
        assert link.toxic_spells == {"downstream": 2}

    _run_proxy_test(body)


def test_a_toxic_that_does_not_apply_leaves_the_connection_on_the_fast_path() -> None:
    async def body(proxy: Proxy, client: trio.SocketStream) -> None:
        assert await _round_trip(client, b"clean") == b"clean"
        (link,) = proxy._links
        proxy.toxics.add(make_toxic("latency", latency=20, toxicity=0.0))
        for i in range(3):
            assert await _round_trip(client, b"data %d" % i) == b"data %d" % i
        assert link.toxic_spells == {}, "toxicity 0: the toxic's stub passes the bytes untouched"

    _run_proxy_test(body)
