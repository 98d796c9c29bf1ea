"""Both clients against the real embedded nemesis: `toxiproxy-python` as a person uses it
(docs/nemesis.md), and the lab's own client (`lab.nemesis.client`): a timeout on every
call, no lock shared between threads, each failure sorted by whether the change may have
happened."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import toxiproxy
import toxiproxy.exceptions

from lab.nemesis.client import (
    ConflictError,
    NotFoundError,
    ToxiproxyClient,
    ToxiproxyRejected,
    ToxiproxyTimeout,
    ToxiproxyUnreachable,
)
from lab.nemesis.toxics import make_toxic
from tests.nemesis.conftest import NemesisProcess, ProxyFactory, listen_port
from tests.nemesis.upstreams import TcpServer, connect, echo, median_round_trip, round_trip

pytestmark = pytest.mark.live


@pytest.fixture
def library(nemesis: NemesisProcess) -> Iterator[toxiproxy.Toxiproxy]:
    """toxiproxy-python pointed at the nemesis, the documented way."""
    server = toxiproxy.Toxiproxy()
    host, port = nemesis.url.removeprefix("http://").rsplit(":", 1)
    server.update_api_consumer(host, int(port))
    yield server


def test_toxiproxy_python_drives_the_nemesis(library: toxiproxy.Toxiproxy, nemesis: NemesisProcess) -> None:
    assert library.running() and "lab-nemesis" in library.version().decode()
    with TcpServer(echo) as up:
        proxy = library.create(upstream=f"127.0.0.1:{up.port}", name="lib_proxy", listen="127.0.0.1:0")
        try:
            port = int(proxy.listen.rsplit(":", 1)[1])
            assert port > 0 and library.get_proxy("lib_proxy").upstream == f"127.0.0.1:{up.port}"
            with connect(port) as s:
                fast = median_round_trip(s)
                proxy.add_toxic(type="latency", attributes={"latency": 300})
                slow = median_round_trip(s)
            assert slow - fast >= 0.2, (fast, slow)
            assert list(proxy.toxics()) == ["latency_downstream"]
            with pytest.raises(toxiproxy.exceptions.ProxyExists):
                library.create(upstream=f"127.0.0.1:{up.port}", name="lib_proxy")
            with pytest.raises(toxiproxy.exceptions.InvalidToxic):
                proxy.add_toxic(type="latency", attributes={"latency": -1})
            with pytest.raises(toxiproxy.exceptions.NotFound):
                proxy.destroy_toxic("no_such_toxic")
            proxy.destroy_toxic("latency_downstream")
            proxy.disable()
            assert not library.get_proxy("lib_proxy").enabled
            library.reset()
            assert library.get_proxy("lib_proxy").enabled and proxy.toxics() == {}
            with connect(port) as s:
                assert round_trip(s) < 5
        finally:
            library.destroy(library.get_proxy("lib_proxy"))
    assert "lib_proxy" not in library.proxies()
    assert [r.type for r in nemesis.records("lib_proxy")][-1] == "proxy_deleted"


def test_the_two_clients_see_one_state(
    library: toxiproxy.Toxiproxy, client: ToxiproxyClient, make_proxy: ProxyFactory
) -> None:
    with TcpServer(echo) as up:
        name = make_proxy(up.port).name
        client.add_toxic(name, make_toxic("bandwidth", stream="upstream", rate=50, toxicity=0.5))
        seen = library.get_proxy(name).get_toxic("bandwidth_upstream")
        assert (seen.type, seen.stream, seen.toxicity, seen.attributes) == (
            "bandwidth",
            "upstream",
            0.5,
            {"rate": 50},
        )
        library.get_proxy(name).add_toxic(type="slow_close", attributes={"delay": 10})
        assert set(client.toxics(name)) == {"bandwidth_upstream", "slow_close_downstream"}


def test_the_own_client_updates_a_toxic_in_place(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    with TcpServer(echo) as up:
        name = make_proxy(up.port).name
        client.add_toxic(name, make_toxic("latency", latency=5))
        client.update_toxic(name, make_toxic("latency", latency=9, jitter=1, toxicity=0.5))
        now = client.toxics(name)["latency_downstream"]
        assert (dict(now.attributes), now.toxicity) == ({"latency": 9, "jitter": 1}, 0.5)
        client.update_toxic(name, make_toxic("latency", stream="downstream", name="other", latency=3))
        assert set(client.toxics(name)) == {"latency_downstream", "other"}, "an absent toxic is added"
        with pytest.raises(ConflictError):
            client.add_toxic(name, make_toxic("latency", latency=1))
        with pytest.raises(ToxiproxyRejected, match="400"):
            client.create_proxy(f"{name}_x", "10.0.0.1:80")
        with pytest.raises(NotFoundError):
            client.toxics("no_such_proxy")
        assert client.get_proxy("no_such_proxy") is None
        port = listen_port(client.proxies()[name])
        with connect(port) as s:
            assert round_trip(s) < 5


def _silent_server() -> tuple[socket.socket, int]:
    """A listening socket that accepts (the kernel does) and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    return server, server.getsockname()[1]


def test_a_silent_api_times_out_and_holds_no_lock(client: ToxiproxyClient, make_proxy: ProxyFactory) -> None:
    silent, port = _silent_server()
    hung = ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=3.0)
    caught: list[BaseException] = []

    def call() -> None:
        try:
            hung.add_toxic("p", make_toxic("latency", latency=1))
        except BaseException as exc:  # recorded for the assertions below
            caught.append(exc)

    with silent, TcpServer(echo) as up:
        thread = threading.Thread(target=call)
        started = time.monotonic()
        thread.start()
        time.sleep(0.2)  # the hung call is under way
        name = make_proxy(up.port).name  # another thread's calls are not held up by it
        client.add_toxic(name, make_toxic("latency", latency=1))
        assert thread.is_alive(), "the other call answered while the hung one was still waiting"
        thread.join(timeout=20)
        waited = time.monotonic() - started
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], ToxiproxyTimeout), caught
    assert caught[0].maybe_done, "sent and unanswered: it may have happened"
    assert waited >= 2.9, "it waited for its timeout"


def test_no_connection_means_the_change_did_not_happen() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # then closed: nothing listens there
    with pytest.raises(ToxiproxyUnreachable) as refused:
        ToxiproxyClient(f"http://127.0.0.1:{port}", timeout=2).remove_toxic("p", "t")
    assert not refused.value.maybe_done and not isinstance(refused.value, ToxiproxyTimeout)
