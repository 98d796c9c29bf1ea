"""Run folders of a client under test, written by hand per docs/ledgers.md (the proxy tap)
and docs/clients.md (the application log), for the checker's client-under-test tests.

`Wire` plays what an SDK client does through the proxy: `init` (initialize, session
assigned), `call` (a POST stream with events, its answer, an outcome), `get` (a GET, with
or without Last-Event-ID), `request` (any other request); each step writes the tap's
records (flow, sent, forwarded, result, flow_end) and the application log's (deliver,
outcome) as the real parts would, so the two agree unless a test makes them disagree.
`Wire.write(run_dir)` writes run.json, proxy/tap.jsonl and clients/app-0.jsonl.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.sut.protocol import SCHEMA, message_digest

T0 = 1_800_000_000.0
BUDGETS: dict[str, float | int] = {
    "reconnect_qps": 5.0,
    "resume_p99_s": 5.0,
    "cross_stream_max": 0,
    "duplicate_dispatch_max": 0,
    "missing_rehandshake_max": 0,
    "origin_reject_rate": 1.0,
    "min_events": 1,
    "min_recoveries": 1,
    "min_404": 1,
    "min_illegal_origin": 1,
}


@dataclass
class Client:
    name: str
    session: str | None = None
    requests: int = 0
    rpc: int = 0


@dataclass
class Wire:
    tap: list[dict[str, Any]] = field(default_factory=list)
    app: list[dict[str, Any]] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    """run.json scenario.faults (storm rules with their Retry-After)."""
    clients: dict[str, Client] = field(default_factory=dict)
    flows: int = 0
    streams: int = 0
    expected_failures: list[str] = field(default_factory=list)
    numbered: bool = True
    """False: every request of a client carries `x-lab-conn: <client>:0` (an adapter that
    cannot number its requests, docs/clients.md)."""

    def __post_init__(self) -> None:
        self.app.append(
            {
                "ev": "ready",
                "t": T0,
                "schema": SCHEMA,
                "adapter": "python-sdk",
                "implementation": {"name": "mcp", "version": "9.9.9"},
                "pid": 1,
            }
        )

    # -- records ---------------------------------------------------------------------------

    def _flow(
        self,
        c: Client,
        t: float,
        method: str,
        *,
        status: int | None = 200,
        session: str | None = None,
        rpc_method: str | None = None,
        rpc_id: int | None = None,
        key: str | None = None,
        cursor: str | None = None,
        answered_by: str = "server",
        faults: list[dict[str, Any]] | None = None,
        session_out: str | None = None,
        answer_after: float = 0.01,
        tool: str = "echo",
    ) -> str:
        self.flows += 1
        c.requests += 1
        flow = f"f{self.flows}"
        stream = "post" if method == "POST" else ("resume" if cursor else "get" if method == "GET" else None)
        self.tap.append(
            {
                "type": "flow",
                "flow": flow,
                "t": t + answer_after,
                "t_request": t,
                "conn": f"{c.name}:{c.requests if self.numbered else 0}",
                "method": method,
                "path": "/mcp",
                "stream": stream,
                "session": session,
                "session_out": session_out,
                "jsonrpc_id": rpc_id,
                "jsonrpc_method": rpc_method,
                "tool": tool if rpc_method == "tools/call" else None,
                "idempotency_key": key,
                "origin_in": None,
                "origin_out": None,
                "origin_allowed_out": None,
                "last_event_id_in": cursor,
                "last_event_id_out": cursor,
                "status": status,
                "answered_by": answered_by,
                "faults": faults or [],
            }
        )
        return flow

    def _end(self, flow: str, t: float, reason: str = "complete") -> None:
        self.tap.append({"type": "flow_end", "flow": flow, "t": t, "reason": reason})

    def _event(
        self,
        flow: str,
        index: int,
        t: float,
        session: str,
        stream_id: str,
        seq: int,
        message: dict[str, Any] | None,
        *,
        forward: bool = True,
        retry_ms: int | None = None,
    ) -> str:
        event_id = f"{session}.{stream_id}.{seq}"
        digest = message_digest(message) if message is not None else message_digest("")
        self.tap.append(
            {
                "type": "sent",
                "flow": flow,
                "t": t,
                "index": index,
                "event_id": event_id,
                "digest": digest,
                "has_data": True,
                "priming": message is None,
                "stream_id": stream_id,
                "session": session,
                "retry": retry_ms,
            }
        )
        if forward:
            self.forward(flow, index, t, event_id, digest, (flow, index))
        else:
            self.tap.append(
                {
                    "type": "dropped",
                    "flow": flow,
                    "t": t,
                    "index": index,
                    "fault": "cut_stream",
                    "rule": "r",
                    "decision": "d_1",
                }
            )
        return event_id

    def forward(
        self,
        flow: str,
        index: int,
        t: float,
        event_id: str,
        digest: str,
        source: tuple[str, int] | None,
        fault: str | None = None,
    ) -> None:
        self.tap.append(
            {
                "type": "forwarded",
                "flow": flow,
                "t": t,
                "index": index,
                "event_id": event_id,
                "digest": digest,
                "source": None if source is None else {"flow": source[0], "index": source[1]},
                "fault": fault,
                "rule": fault and "rule#0",
                "decision": fault and "d_0000000000000001",
            }
        )

    def deliver(self, c: Client, t: float, message: dict[str, Any], call: str | None) -> None:
        rid = message.get("id")
        kind = "notification" if "method" in message else ("error" if "error" in message else "response")
        self.app.append(
            {
                "ev": "deliver",
                "t": t,
                "client": c.name,
                "session": c.session,
                "kind": kind,
                "id": rid,
                "method": message.get("method"),
                "call": call,
                "digest": message_digest(message),
            }
        )

    def outcome(
        self, c: Client, t: float, call: str, rpc_id: int, status: str = "ok", error: str | None = None
    ) -> None:
        self.app.append(
            {
                "ev": "outcome",
                "t": t,
                "client": c.name,
                "session": c.session,
                "call": call,
                "id": rpc_id,
                "status": status,
                "error": error,
                "code": None,
                "elapsed_s": 0.1,
            }
        )

    # -- steps -----------------------------------------------------------------------------

    def init(self, name: str, t: float, session: str | None = None) -> Client:
        c = self.clients.setdefault(name, Client(name))
        had = c.session
        c.session = session or f"s_{name}_{len(self.tap)}"
        c.rpc += 1
        flow = self._flow(c, t, "POST", rpc_method="initialize", rpc_id=c.rpc, session_out=c.session)
        self._end(flow, t + 0.01)
        if had is None:
            self.app.append(
                {
                    "ev": "started",
                    "t": t + 0.02,
                    "client": name,
                    "session": c.session,
                    "protocolVersion": "2025-11-25",
                    "elapsed_s": 0.02,
                }
            )
        return c

    def call(
        self,
        c: Client,
        t: float,
        key: str,
        *,
        progress: int = 2,
        cut_after: int | None = None,
        deliver: bool = True,
        outcome: str | None = "ok",
        retry_ms: int | None = None,
        tool: str = "echo",
    ) -> tuple[str, list[str]]:
        """A tools/call POST stream: a priming event, `progress` notifications, the response;
        `cut_after`: the stream is cut after that many progress events (no response)."""
        assert c.session is not None
        c.rpc += 1
        rid = c.rpc
        flow = self._flow(
            c, t, "POST", session=c.session, rpc_method="tools/call", rpc_id=rid, key=key, tool=tool
        )
        self.streams += 1
        sid = f"p{self.streams}"
        ids = [self._event(flow, 0, t + 0.01, c.session, sid, 0, None, retry_ms=retry_ms)]
        n = progress if cut_after is None else cut_after
        for i in range(n):
            msg = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": rid, "progress": i},
            }
            ids.append(self._event(flow, i + 1, t + 0.02 + i * 0.01, c.session, sid, i + 1, msg))
            if deliver:
                self.deliver(c, t + 0.025 + i * 0.01, msg, None)
        done = t + 0.05 + n * 0.01
        if cut_after is not None:
            self._end(flow, done, "cut_by_fault")
            return flow, ids
        answer = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": key}]}}
        ids.append(self._event(flow, n + 1, done, c.session, sid, n + 1, answer))
        self.tap.append(
            {
                "type": "result",
                "flow": flow,
                "t": done,
                "session": c.session,
                "auth": None,
                "jsonrpc_id": rid,
                "idempotency_key": key,
                "tool": tool,
                "is_error": False,
                "result_digest": message_digest(answer["result"]),
            }
        )
        self._end(flow, done + 0.001)
        if deliver:
            self.deliver(c, done + 0.002, answer, key)
        if outcome is not None:
            self.outcome(c, done + 0.003, key, rid, outcome)
        return flow, ids

    def resume(
        self,
        c: Client,
        t: float,
        cursor: str,
        *,
        of: tuple[str, int, int] | None = None,
        key: str | None = None,
        status: int = 200,
        session: str | None = None,
        answered_by: str = "server",
        faults: list[dict[str, Any]] | None = None,
        answer_after: float = 0.02,
    ) -> str:
        """A GET with Last-Event-ID. `of` = (stream id, next sequence, rpc id): the server
        replays the rest of that stream and the call's answer (delivered, then its outcome),
        its first event `answer_after` s after the proxy had the request."""
        flow = self._flow(
            c,
            t,
            "GET",
            status=status,
            session=session or c.session,
            cursor=cursor,
            answered_by=answered_by,
            faults=faults,
        )
        if of is None or status != 200:
            self._end(flow, t + 0.01)
            return flow
        sid, seq, rid = of
        assert c.session is not None
        answer = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": str(key)}]}}
        self._event(flow, 0, t + answer_after, c.session, sid, seq, answer)
        self._end(flow, t + answer_after + 0.01)
        self.deliver(c, t + answer_after + 0.011, answer, key)
        if key is not None:
            self.outcome(c, t + answer_after + 0.012, key, rid)
        return flow

    def tools_list(self, c: Client, t: float, tools: dict[str, dict[str, bool]]) -> str:
        """A `tools/list` request and its answer (the tap's `tools` record): `tools` maps
        each listed tool to its annotations."""
        c.rpc += 1
        flow = self.request(c, t, "POST", session=c.session, rpc_method="tools/list", rpc_id=c.rpc)
        self.tap.append({"type": "tools", "flow": flow, "t": t + 0.011, "session": c.session, "tools": tools})
        return flow

    def request(self, c: Client, t: float, method: str, **kw: Any) -> str:
        flow = self._flow(c, t, method, **kw)
        self._end(flow, t + 0.011)
        return flow

    # -- the folder ------------------------------------------------------------------------

    def write(self, run_dir: Path, budgets: dict[str, float | int] | None = None) -> Path:
        (run_dir / "proxy").mkdir(parents=True, exist_ok=True)
        (run_dir / "clients").mkdir(exist_ok=True)
        # The run goes on 10 s after the last record: no loss is censored for being too late.
        end = max([r["t"] for r in self.tap] + [r["t"] for r in self.app] + [T0]) + 10
        run = {
            "schema": "mcpLabRun.v1",
            "run_id": run_dir.name,
            "status": "finished",
            "complete": True,
            "end_reason": "duration",
            "started_at": T0,
            "stopped_at": end,
            "seed": 1,
            "budgets": budgets or BUDGETS,
            "scenario": {
                "name": "hand",
                "faults": self.faults,
                "target": {"kind": "reference", "retry_after": 1},
            },
            "target": {"kind": "reference"},
            "fault_windows": [],
            "client": {
                "kind": "python-sdk",
                "implementation": {"name": "mcp", "version": "9.9.9"},
                "expected_failures": self.expected_failures,
                "baseline": "scenario" if self.expected_failures else None,
            },
        }
        (run_dir / "run.json").write_text(json.dumps(run))
        tap = sorted(self.tap, key=lambda r: r["t"])
        (run_dir / "proxy" / "tap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tap))
        app = sorted(self.app, key=lambda r: r["t"])
        (run_dir / "clients" / "app-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in app))
        return run_dir
