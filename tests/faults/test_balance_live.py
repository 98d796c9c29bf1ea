"""The proxy as a balancer, end to end: two real `lab serve` replicas (each with its own
state), a real mitmdump with addons/mcp_faults.py routing over both, a small httpx
client, and assertions on the tap's `flow.replica` and statuses (and `fault.replica`).

Each test starts its own proxy, so its round-robin counter starts at replica 0; the two
replicas serve the whole module (every test makes sessions of its own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.faults.launch import balancer_options
from tests.faults.live import (
    TOKENS,
    McpClient,
    Proc,
    Tap,
    fault_proxy,
    origin_of,
    reference_server,
    server_available,
    write_plan,
)

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not server_available(), reason="the reference server (lab/server) is not there yet"),
]

INIT_PARAMS = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "balance-tests", "version": "0"},
}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Proc]]:
    tmp = tmp_path_factory.mktemp("replicas")
    (tmp / "r0").mkdir()
    (tmp / "r1").mkdir()
    with (
        reference_server(tmp / "r0", "--tokens", TOKENS) as r0,
        reference_server(tmp / "r1", "--tokens", TOKENS) as r1,
    ):
        yield [r0, r1]


@dataclass
class Balanced:
    url: str
    tap: Tap


@contextlib.contextmanager
def balancer(
    tmp: Path, servers: list[Proc], affinity: str, rules: list[dict[str, Any]] | None = None
) -> Iterator[Balanced]:
    """mitmdump with the fault addon in front of `servers`, routing over them."""
    plan, tap = tmp / "plan.json", tmp / "proxy" / "tap.jsonl"
    write_plan(plan, {"seed": 7, "rules": rules or []})
    upstreams = [origin_of(s.url) for s in servers]
    extra = [
        a
        for name, value in balancer_options(upstreams, affinity).items()
        for a in ("--set", f"{name}={value}")
    ]
    with fault_proxy(tmp, upstreams[0], plan, tap, *extra) as px:
        yield Balanced(px.url + "/mcp", Tap(tap))


def open_session(c: McpClient) -> str:
    """`initialize` through the proxy; the conn of its request. The client keeps the session."""
    conn = c.conn()
    ex = c.request("POST", conn, body=c.rpc("initialize", INIT_PARAMS))
    assert ex.status == 200, (ex.status, ex.body)
    c.session_id = ex.headers["mcp-session-id"]
    return conn


def session_requests(*clients: McpClient) -> list[list[tuple[str, int | None]]]:
    """A few requests carrying each client's session, the clients taking turns request by
    request: per client, (conn, status as the client saw it)."""
    out: list[list[tuple[str, int | None]]] = [[] for _ in clients]
    for n in range(5):
        for c, sent in zip(clients, out, strict=True):
            body = (
                {"jsonrpc": "2.0", "method": "notifications/initialized"}
                if n == 0
                else c.rpc("tools/list" if n % 2 else "ping", {})
            )
            conn = c.conn()
            sent.append((conn, c.request("POST", conn, body=body).status))
    return out


def test_round_robin_sends_a_session_to_the_replica_that_never_saw_it(
    tmp_path: Path, replicas: list[Proc]
) -> None:
    with balancer(tmp_path, replicas, "none") as lb, McpClient(lb.url, "rr") as c:
        init = lb.tap.flow_of(open_session(c))
        [sent] = session_requests(c)
        flows = [lb.tap.flow_of(conn) for conn, _ in sent]
    assert init["replica"] == 0 and init["status"] == 200 and init["session_out"] is not None
    assert [f["replica"] for f in flows] == [1, 0, 1, 0, 1], "request by request, alternating"
    assert all(f["session"] == init["session_out"] for f in flows)
    # The replica that created the session serves it; the other never saw it: 404.
    assert [(f["replica"], f["status"]) for f in flows] == [(1, 404), (0, 200), (1, 404), (0, 200), (1, 404)]
    assert [status for _, status in sent] == [f["status"] for f in flows], "the tap says what the client got"


def test_session_affinity_keeps_each_session_on_the_replica_that_created_it(
    tmp_path: Path, replicas: list[Proc]
) -> None:
    with (
        balancer(tmp_path, replicas, "session") as lb,
        McpClient(lb.url, "a") as a,
        McpClient(lb.url, "b") as b,
        McpClient(lb.url, "newcomer") as newcomer,
    ):
        init_a, init_b = lb.tap.flow_of(open_session(a)), lb.tap.flow_of(open_session(b))
        sent_a, sent_b = session_requests(a, b)
        # A request naming no session (a third initialize) is routed round-robin: replica 0.
        init_new = lb.tap.flow_of(open_session(newcomer))
        flows_a = [lb.tap.flow_of(conn) for conn, _ in sent_a]
        flows_b = [lb.tap.flow_of(conn) for conn, _ in sent_b]
    assert (init_a["replica"], init_b["replica"], init_new["replica"]) == (0, 1, 0)
    assert [f["replica"] for f in flows_a] == [0] * 5 and [f["replica"] for f in flows_b] == [1] * 5
    assert all(f["session"] == init_a["session_out"] for f in flows_a)
    assert all(f["session"] == init_b["session_out"] for f in flows_b)
    statuses = [f["status"] for f in flows_a + flows_b]
    assert 404 not in statuses and all(s in (200, 202) for s in statuses), statuses
    # Asked directly, past the proxy: each session lives on the replica the tap names only.
    assert (lives_on(a, replicas), lives_on(b, replicas), lives_on(newcomer, replicas)) == ([0], [1], [0])


def test_the_proxys_own_calls_go_to_the_sessions_replica(tmp_path: Path, replicas: list[Proc]) -> None:
    rules = [
        {"kind": "expiry_race", "rate": 1.0, "match": {"tools": ["clock"]}},
        {"kind": "kill_session", "rate": 1.0, "match": {"tools": ["echo"]}},
    ]
    with (
        balancer(tmp_path, replicas, "session", rules) as lb,
        McpClient(lb.url, "a") as a,
        McpClient(lb.url, "b") as b,
        McpClient(lb.url, "c") as c,
    ):
        for client in (a, b, c):  # replicas 0, 1, 0
            open_session(client)
        conn_a, conn_b = a.conn(), b.conn()
        assert a.call("echo", {"text": "hi"}, conn=conn_a).status == 200  # then its session is deleted
        assert b.call("clock", {}, conn=conn_b).status == 200  # then its session is expired
        after = {name: ping(cl) for name, cl in (("a", a), ("b", b), ("c", c))}
        flow_a, flow_b = lb.tap.flow_of(conn_a), lb.tap.flow_of(conn_b)
        faults = {r["fault"]: r for r in lb.tap.records(type="fault")}
    assert (flow_a["replica"], flow_b["replica"]) == (0, 1)
    kill, expiry = faults["kill_session"], faults["expiry_race"]
    assert (kill["flow"], kill["replica"], kill["detail"]["delete_status"]) == (flow_a["flow"], 0, 200)
    assert (expiry["flow"], expiry["replica"], expiry["detail"]["admin_status"]) == (flow_b["flow"], 1, 200)
    # Each call ended its session where it lived; the session beside it on replica 0 lives on.
    assert after == {"a": 404, "b": 404, "c": 200}


def lives_on(c: McpClient, replicas: list[Proc]) -> list[int]:
    """The replicas that serve the client's session when asked directly (not through the proxy)."""
    assert c.session_id is not None
    found = []
    for k, server in enumerate(replicas):
        with McpClient(server.url, f"direct-{k}") as direct:
            direct.session_id = c.session_id
            if ping(direct) == 200:
                found.append(k)
    return found


def ping(c: McpClient) -> int | None:
    return c.request("POST", c.conn(), body=c.rpc("ping", {})).status
