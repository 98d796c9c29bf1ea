"""Real processes for the fault-layer tests: the reference server and mitmdump with our addon.

Everything binds 127.0.0.1; ports are chosen by the processes themselves (port 0) and
read from their "listening" line; processes are stopped by PID (SIGTERM, then SIGKILL).
`McpClient` is a tiny synchronous MCP client on httpx that keeps the raw SSE it got,
so tests can assert on the wire. `Tap` reads the proxy's tap.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from lab.checker.inputs.tap_forms import expand_all
from lab.faults.launch import TAP_ADDON, mitmdump_argv, ready_prefix
from lab.wire.sse import SseDecoder, SseEvent
from tests.livesrv import stop, wait_for_line

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LEDGER_KEY = "cd" * 32
ADMIN_TOKEN = "admin-token-for-tests"
TOKENS = "alice=alice,bob=bob"
VERSION = "2025-11-25"
ORIGIN = "http://127.0.0.1"


def server_available() -> bool:
    """The reference server is built by another engineer; until it is there, live tests skip."""
    return (ROOT / "lab" / "server" / "app.py").exists()


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _start(argv: list[str], log: Path, prefix: str, env: dict[str, str] | None = None) -> Proc:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **(env or {})}
        )
    try:
        url = wait_for_line(proc, log, prefix, timeout=30.0)
    except BaseException:
        stop(proc)
        raise
    return Proc(proc, log, url)


@contextlib.contextmanager
def reference_server(tmp: Path, *extra: str) -> Iterator[Proc]:
    argv = [
        str(BIN / "lab"),
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--ledger",
        str(tmp / "server-ledger.sqlite"),
        "--admin-token",
        ADMIN_TOKEN,
        *extra,
    ]
    p = _start(argv, tmp / "server.log", "lab-serve listening on ", {"LAB_LEDGER_KEY": LEDGER_KEY})
    try:
        yield p
    finally:
        stop(p.proc)


@contextlib.contextmanager
def fault_proxy(tmp: Path, upstream: str, plan: Path, tap: Path, *extra: str) -> Iterator[Proc]:
    """mitmdump -s addons/mcp_faults.py in reverse mode in front of `upstream` (http://host:port)."""
    options = {
        "mcpfaults_plan": str(plan),
        "mcpfaults_tap": str(tap),
        "mcpfaults_poll": "0.05",
        "mcpfaults_admin_token": ADMIN_TOKEN,
    }
    argv = [*mitmdump_argv(upstream, options=options), *extra]
    p = _start(
        argv,
        tmp / f"proxy-{time.monotonic_ns()}.log",
        ready_prefix(),
        {"LAB_LEDGER_KEY": LEDGER_KEY},
    )
    try:
        yield p
    finally:
        stop(p.proc)


@contextlib.contextmanager
def tap_proxy(tmp: Path, upstream: str, tap: Path) -> Iterator[Proc]:
    """mitmdump -s addons/mcp_tap.py alone (no faults) in front of `upstream`."""
    argv = mitmdump_argv(upstream, script=TAP_ADDON, options={"mcpfaults_tap": str(tap)})
    p = _start(argv, tmp / "tap-proxy.log", ready_prefix(TAP_ADDON), {"LAB_LEDGER_KEY": LEDGER_KEY})
    try:
        yield p
    finally:
        stop(p.proc)


def origin_of(url: str) -> str:
    """http://127.0.0.1:PORT/mcp -> http://127.0.0.1:PORT"""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


# ---------------------------------------------------------------------- the tap


class Tap:
    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self, **match: Any) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        # As the checker reads the tap: short forms expanded (lab.checker.inputs.tap_forms).
        lines = [json.loads(line) for line in self.path.read_text().splitlines()]
        for r in expand_all(lines):
            if all(r.get(k) == v for k, v in match.items()):
                out.append(r)
        return out

    def flow_of(self, conn: str) -> dict[str, Any]:
        flows = self.records(type="flow", conn=conn)
        assert len(flows) == 1, f"expected one flow record for {conn}, got {flows}"
        return flows[0]

    def of_flow(self, flow_id: str, kind: str) -> list[dict[str, Any]]:
        return self.records(type=kind, flow=flow_id)

    def wait(self, timeout: float = 5.0, **match: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.records(**match)
            if got:
                return got
            time.sleep(0.02)
        raise AssertionError(f"no tap record {match} within {timeout}s")


# ---------------------------------------------------------------------- a tiny MCP client


@dataclass
class Exchange:
    """One request's answer as the client saw it."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    events: list[SseEvent] = field(default_factory=list)
    error: str | None = None
    """Why the response ended early (a cut), None if it completed."""

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(e.data) for e in self.events if e.data]


class McpClient:
    """A synchronous MCP client for tests; every request gets `x-lab-conn: <name>:<n>`."""

    def __init__(
        self,
        url: str,
        name: str,
        *,
        token: str | None = "alice",
        origin: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.url = url
        self.name = name
        self.token = token
        self.origin = origin
        self.session_id: str | None = None
        self.n = 0
        self._next_id = 1
        self.http = httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def conn(self) -> str:
        self.n += 1
        return f"{self.name}:{self.n}"

    def headers(self, conn: str, **extra: str) -> dict[str, str]:
        h = {"accept": "application/json, text/event-stream", "x-lab-conn": conn}
        if self.session_id is not None:
            h["mcp-session-id"] = self.session_id
            h["mcp-protocol-version"] = VERSION
        if self.token is not None:
            h["authorization"] = f"Bearer {self.token}"
        if self.origin is not None:
            h["origin"] = self.origin
        h.update(extra)
        return h

    def request(
        self, method: str, conn: str, *, body: Any = None, headers: dict[str, str] | None = None
    ) -> Exchange:
        h = self.headers(conn, **(headers or {}))
        content = None
        if body is not None:
            h["content-type"] = "application/json"
            content = json.dumps(body).encode()
        ex = Exchange(status=None)
        try:
            with self.http.stream(method, self.url, headers=h, content=content) as r:
                ex.status = r.status_code
                ex.headers = dict(r.headers)
                decoder = SseDecoder()
                sse = r.headers.get("content-type", "").startswith("text/event-stream")
                try:
                    for chunk in r.iter_raw():
                        ex.body += chunk
                        if sse:
                            ex.events += decoder.feed(chunk)
                except httpx.HTTPError as e:
                    ex.error = f"{type(e).__name__}: {e}"
        except httpx.HTTPError as e:
            ex.error = f"{type(e).__name__}: {e}"
        return ex

    def initialize(self) -> Exchange:
        self.session_id = None
        ex = self.request("POST", self.conn(), body=self.rpc("initialize", self._init_params()))
        assert ex.status == 200, (ex.status, ex.body)
        self.session_id = ex.headers["mcp-session-id"]
        done = self.request(
            "POST", self.conn(), body={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        assert done.status == 202, (done.status, done.body)
        return ex

    @staticmethod
    def _init_params() -> dict[str, Any]:
        return {
            "protocolVersion": VERSION,
            "capabilities": {},
            "clientInfo": {"name": "fault-tests", "version": "0"},
        }

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = self._next_id
        self._next_id += 1
        return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}

    def call(
        self, tool: str, arguments: dict[str, Any], *, conn: str | None = None, key: str | None = None
    ) -> Exchange:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        meta: dict[str, Any] = {"progressToken": self._next_id}
        if key is not None:
            meta["mcp-lab/idempotency-key"] = key
        params["_meta"] = meta
        return self.request("POST", conn or self.conn(), body=self.rpc("tools/call", params))

    def resume(self, last_event_id: str, *, conn: str | None = None) -> Exchange:
        return self.request("GET", conn or self.conn(), headers={"last-event-id": last_event_id})

    def delete(self, *, conn: str | None = None) -> Exchange:
        return self.request("DELETE", conn or self.conn())

    @contextlib.contextmanager
    def standalone(self, conn: str | None = None) -> Iterator[httpx.Response]:
        """Open the standalone GET stream and keep it open (unread) while the block runs."""
        h = self.headers(conn or self.conn())
        with self.http.stream("GET", self.url, headers=h) as r:
            assert r.status_code == 200, r.status_code
            yield r


def ledger_rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def wait_rows(
    path: Path, sql: str, params: tuple[Any, ...] = (), timeout: float = 5.0
) -> list[tuple[Any, ...]]:
    """Rows of the server ledger once there are some (it is written in batches)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError):
            rows = ledger_rows(path, sql, params)
            if rows:
                return rows
        time.sleep(0.05)
    raise AssertionError(f"no ledger rows for {sql} {params} within {timeout}s")


def write_plan(path: Path, plan: dict[str, Any]) -> None:
    """Replace the plan file atomically, as an orchestrator changing faults mid-run would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)
