"""The balancer inside the fault addon, under mitmproxy's test context (no sockets): off by
default, what a routed request looks like as it leaves, answers of the proxy's own left
unrouted, the learnt sessions kept across a plan change, bad options refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from mitmproxy import exceptions

from tests.faults.harness import Harness, call, rpc

pytestmark = pytest.mark.anyio

TWO = "127.0.0.1:8001,127.0.0.1:8002"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_off_by_default_the_request_and_the_tap_are_as_before(tmp_path: Path) -> None:
    h = Harness(tmp_path, [])
    assert h.addon.balancer is None
    f = h.request(h.flow(body=rpc("ping"), session="s-1"))
    h.respond(f, sse=False)
    await h.finish(f, b"{}")
    assert (f.request.host, f.request.port, f.request.headers["host"]) == ("127.0.0.1", 9, "127.0.0.1:9")
    [flow] = h.tap(type="flow")
    assert "replica" not in flow


async def test_a_routed_request_names_its_replica_in_host_and_tap(tmp_path: Path) -> None:
    h = Harness(tmp_path, [], mcpfaults_replicas=TWO, mcpfaults_affinity="session")
    init = h.request(h.flow(body=rpc("initialize"), session=None, conn="c1:1"))
    h.respond(init, sse=False, headers={"mcp-session-id": "s-new"})
    await h.finish(init, b"{}")
    other = h.request(h.flow(body=rpc("ping"), session=None, conn="c2:1"))  # round-robin: replica 1
    again = h.request(h.flow(body=rpc("ping"), session="s-new", conn="c1:2"))  # its session's: replica 0
    assert (init.request.port, other.request.port, again.request.port) == (8001, 8002, 8001)
    assert again.request.headers["host"] == "127.0.0.1:8001", "the Host header follows the replica"
    for f in (other, again):
        h.respond(f, sse=False)
        await h.finish(f, b"{}")
    assert {r["conn"]: r["replica"] for r in h.tap(type="flow")} == {"c1:1": 0, "c2:1": 1, "c1:2": 0}


async def test_an_answer_of_the_proxys_own_is_not_routed(tmp_path: Path) -> None:
    storm = [{"kind": "storm", "rate": 1.0, "match": {"tools": ["clock"]}}]
    h = Harness(tmp_path, storm, mcpfaults_replicas=TWO)
    stormed = h.request(h.flow(body=call("clock"), conn="c1:1"))
    passed = h.request(h.flow(body=call("echo"), conn="c1:2"))
    assert stormed.response is not None and stormed.response.status_code == 503
    await h.finish(stormed)
    h.respond(passed, sse=False)
    await h.finish(passed, b"{}")
    flows = {r["conn"]: r for r in h.tap(type="flow")}
    assert flows["c1:1"]["answered_by"] == "proxy" and "replica" not in flows["c1:1"]
    assert flows["c1:2"]["replica"] == 0, "the storm took no turn of the round robin"


async def test_a_plan_change_keeps_the_sessions_learnt(tmp_path: Path) -> None:
    h = Harness(tmp_path, [], mcpfaults_replicas=TWO, mcpfaults_affinity="session")
    h.request(h.flow(body=rpc("ping"), session=None, conn="c0:1"))  # replica 0: the next new one gets 1
    init = h.request(h.flow(body=rpc("initialize"), session=None, conn="c1:1"))
    h.respond(init, sse=False, headers={"mcp-session-id": "s-on-1"})
    balancer = h.addon.balancer
    h.configure(mcpfaults_plan='{"seed": 1, "rules": []}')
    assert h.addon.balancer is balancer
    assert h.request(h.flow(body=rpc("ping"), session="s-on-1", conn="c1:2")).request.port == 8002
    h.configure(mcpfaults_replicas="")
    assert h.addon.balancer is None, "the option emptied: off again"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mcpfaults_replicas": "127.0.0.1"}, "mcpfaults_replicas: expected host:port"),
        ({"mcpfaults_replicas": "a:1,a:1"}, "listed twice"),
        ({"mcpfaults_affinity": "sticky"}, "mcpfaults_affinity: expected one of none, session"),
    ],
)
async def test_bad_balancer_options_are_refused(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    h = Harness(tmp_path, [])
    with pytest.raises(exceptions.OptionsError) as e:
        h.configure(**options)
    assert message in str(e.value)
