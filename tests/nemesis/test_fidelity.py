"""Where the embedded nemesis must act as a real Toxiproxy does, on real sockets: removing a
`timeout` toxic closes every connection whatever its toxicity roll said, and removing a
`reset_peer` during its wait still resets the connection (never a stream with a chunk
missing). Each case runs against the embedded nemesis, and against a real
`toxiproxy-server` too when `LAB_TOXIPROXY_SERVER` names one (tests/nemesis/realserver.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.nemesis.client import ToxiproxyClient
from lab.nemesis.log import NemesisLog, read_toxic_outcomes
from lab.nemesis.schedule import API_TIMEOUT_BASE_S, ScheduledToxic, ToxicScheduleRunner
from lab.nemesis.toxics import make_toxic
from tests.nemesis.conftest import NemesisProcess, listen_port
from tests.nemesis.realserver import real_server_binary, running_real_toxiproxy
from tests.nemesis.upstreams import Received, TcpServer, connect, echo, read_until_end, round_trip

pytestmark = pytest.mark.live


@pytest.fixture(params=["embedded", "real"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToxiproxyClient]:
    if request.param == "embedded":
        nemesis: NemesisProcess = request.getfixturevalue("nemesis")
        yield ToxiproxyClient(nemesis.url, timeout=15)
        return
    binary = real_server_binary()
    if binary is None:
        pytest.skip("no real toxiproxy-server: set LAB_TOXIPROXY_SERVER to compare with one")
    with running_real_toxiproxy(binary, tmp_path / "toxiproxy.log") as url:
        yield ToxiproxyClient(url, timeout=15)


@contextlib.contextmanager
def _proxy(api: ToxiproxyClient, name: str, upstream_port: int) -> Iterator[int]:
    if api.get_proxy(name) is not None:
        api.delete_proxy(name)
    info = api.create_proxy(name, f"127.0.0.1:{upstream_port}")
    try:
        yield listen_port(info)
    finally:
        api.delete_proxy(name)


def _ended(r: Received) -> bool:
    return r.eof_at is not None or r.error is not None


def test_removing_a_timeout_toxic_closes_every_connection_whatever_its_roll(api: ToxiproxyClient) -> None:
    """Toxicity 0.0001 applies to none of the five connections, yet its removal closes them
    all (a real Toxiproxy cleans up the toxic on every connection it is part of)."""
    with TcpServer(echo) as up, _proxy(api, "fidelity_timeout", up.port) as port:
        socks = [connect(port) for _ in range(5)]
        try:
            for s in socks:
                round_trip(s)  # every connection is live before the toxic
            api.add_toxic(
                "fidelity_timeout", make_toxic("timeout", stream="upstream", timeout=0, toxicity=0.0001)
            )
            for s in socks:
                assert round_trip(s) < 5, "the toxic applies to none of them (toxicity 0.0001)"
            api.remove_toxic("fidelity_timeout", "timeout_upstream")
            ends = [read_until_end(s, within=5) for s in socks]
        finally:
            for s in socks:
                s.close()
        assert all(_ended(r) for r in ends), [(r.eof_at, r.error) for r in ends]
        assert all(r.data == b"" for r in ends)
        with connect(port) as fresh:
            assert round_trip(fresh) < 5, "a new connection flows"


def test_removing_reset_peer_during_its_wait_still_resets(api: ToxiproxyClient) -> None:
    """`a` passes; `b` triggers the reset (dropped, the wait starts); the toxic is removed
    during the wait; `c` is sent. A real proxy resets the connection: `c` must never
    arrive after a stream that lost `b`."""
    with TcpServer(echo) as up, _proxy(api, "fidelity_reset", up.port) as port, connect(port) as s:
        s.sendall(b"a")
        assert s.recv(10) == b"a"
        api.add_toxic("fidelity_reset", make_toxic("reset_peer", timeout=1500))
        s.sendall(b"b")  # its echo triggers the toxic
        # The removal: a real Toxiproxy answers it only once the reset fired, so it runs
        # in a thread while `c` goes out.
        removal = threading.Thread(target=api.remove_toxic, args=("fidelity_reset", "reset_peer_downstream"))
        threading.Timer(0.3, removal.start).start()
        threading.Event().wait(0.6)  # the toxic is (being) removed, the wait still runs
        s.sendall(b"c")
        got = read_until_end(s, within=8)
        removal.join(timeout=15)
    assert b"c" not in got.data and b"b" not in got.data, got.data
    assert _ended(got), "the connection must end"
    assert got.data == b"", got.data


def test_a_connection_that_took_no_reset_goes_on_after_the_removal(api: ToxiproxyClient) -> None:
    """The good case beside the one above: a reset_peer that never triggered is removed and
    the connection carries every byte in order."""
    with TcpServer(echo) as up, _proxy(api, "fidelity_idle", up.port) as port, connect(port) as s:
        assert round_trip(s, b"a") < 5
        api.add_toxic("fidelity_idle", make_toxic("reset_peer", timeout=1500))
        api.remove_toxic("fidelity_idle", "reset_peer_downstream")
        assert round_trip(s, b"bc") < 5


def test_the_schedule_outlasts_a_removal_held_by_a_waiting_reset(
    api: ToxiproxyClient, tmp_path: Path
) -> None:
    """A real Toxiproxy answers the DELETE of a triggered reset_peer only once the reset
    fired (3 s here). The runner's API timeout is derived from the toxic's wait, so the
    removal comes back `ok`, not as a timeout that would leave the run unsure."""
    reset = make_toxic("reset_peer", timeout=3000)
    with TcpServer(echo) as up, _proxy(api, "fidelity_held", up.port) as port, connect(port) as s:
        start = time.time()
        entries = [ScheduledToxic("fidelity_held", reset, at=0.0, until=1.0)]
        with NemesisLog(tmp_path / "outcomes.jsonl") as log:
            runner = ToxicScheduleRunner(api, entries, start, log=log)
            assert runner.api_timeout == API_TIMEOUT_BASE_S + 3.0
            thread = threading.Thread(target=runner.run)
            thread.start()
            time.sleep(0.5)  # the toxic is in place
            s.sendall(b"x")  # its echo triggers the wait
            thread.join(timeout=30)
        got = read_until_end(s, within=8)
    assert not thread.is_alive()
    outcomes = read_toxic_outcomes(tmp_path / "outcomes.jsonl")
    assert [(o.action, o.outcome) for o in outcomes] == [("add", "ok"), ("remove", "ok")], outcomes
    assert _ended(got) and got.data == b""
