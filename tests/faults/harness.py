"""Drive the addons through mitmproxy's test context (taddons/tflow) without sockets.

`Harness` loads `McpFaults` and its tap (`McpTap`) with a plan, builds flows as the proxy
would see them, runs the hooks in mitmproxy's order (request -> responseheaders -> stream
chunks -> response), each hook on both addons in their load order (the fault addon, then
the tap), and reads the tap they wrote. The I/O seams are replaced: `cuts` records
connection cuts, `calls` records the side calls (admin expire, DELETE) the proxy would
make, and the clock is a counter.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mcp_faults
import mcp_tap
from mitmproxy import http
from mitmproxy.test import taddons, tflow

from lab.checker.inputs.tap_forms import expand_all
from lab.faults.kinds.base import HttpCall
from lab.wire.sse import SseDecoder, SseEvent, encode_event

KEY_HEX = "ef" * 32
UPSTREAM = "http://127.0.0.1:9/mcp"


class Clock:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


class Harness:
    def __init__(
        self, tmp: Path, rules: list[dict[str, Any]] | None = None, *, seed: int = 7, **options: Any
    ) -> None:
        self.tmp = tmp
        self.tap_path = tmp / "tap.jsonl"
        self.tap_addon = mcp_tap.McpTap()
        self.addon = mcp_faults.McpFaults(self.tap_addon)
        self.clock = Clock()
        self.addon.clock = self.tap_addon.clock = self.clock
        self.cuts: list[http.HTTPFlow] = []
        self.addon.cutter = self.cuts.append
        self.calls: list[HttpCall] = []
        self.addon.caller = self._call
        self.call_status = 200
        self.ctx: Any = taddons.context(self.addon, self.tap_addon)  # type: ignore[no-untyped-call]
        opts: dict[str, Any] = {
            "mcpfaults_tap": str(self.tap_path),
            "mcpfaults_key": KEY_HEX,
            "mcpfaults_admin_token": "admin-token",
            "mcpfaults_run_start": "1000",
        }
        if rules is not None:
            opts["mcpfaults_plan"] = json.dumps({"seed": seed, "rules": rules})
        opts.update(options)
        self.configure(**opts)

    async def _call(self, call: HttpCall) -> int:
        self.calls.append(call)
        await asyncio.sleep(0)  # a real call yields to the loop
        return self.call_status

    def configure(self, **options: Any) -> None:
        self.ctx.configure(self.addon, **options)  # every loaded addon sees the change

    # ------------------------------------------------------------------ flows

    def flow(
        self,
        method: str = "POST",
        *,
        conn: str | None = "c1:1",
        session: str | None = "sess-1",
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> http.HTTPFlow:
        h: dict[str | bytes, str | bytes] = {
            "accept": "application/json, text/event-stream",
            "host": "127.0.0.1:9",
        }
        if conn is not None:
            h["x-lab-conn"] = conn
        if session is not None:
            h["mcp-session-id"] = session
            h["mcp-protocol-version"] = "2025-11-25"
        content = b""
        if body is not None:
            h["content-type"] = "application/json"
            content = json.dumps(body).encode()
        h.update(headers or {})
        req = http.Request.make(method, UPSTREAM, content, h)
        return tflow.tflow(req=req)

    def request(self, f: http.HTTPFlow) -> http.HTTPFlow:
        self.addon.request(f)
        self.tap_addon.request(f)
        return f

    def respond(
        self, f: http.HTTPFlow, status: int = 200, *, sse: bool = True, headers: dict[str, str] | None = None
    ) -> None:
        """The response head arrives (skipped if the request was answered by the proxy)."""
        if f.response is not None:
            return
        h = {"content-type": "text/event-stream" if sse else "application/json"}
        h.update(headers or {})
        f.response = http.Response.make(status, b"", h)
        self.addon.responseheaders(f)
        self.tap_addon.responseheaders(f)

    async def stream(self, f: http.HTTPFlow, chunks: Iterable[bytes], *, end: bool = True) -> bytes:
        """Feed body chunks through the streaming callable, as mitmproxy does; the bytes out."""
        assert f.response is not None and callable(f.response.stream)
        out = b""
        for chunk in chunks:
            got = f.response.stream(chunk)
            assert not isinstance(got, bytes), "the streamer must return a list (b'' ends chunked bodies)"
            out += b"".join(got)
            await asyncio.sleep(0)  # let a scheduled cut run, as the proxy's loop would
        if end:
            got = f.response.stream(b"")
            out += got if isinstance(got, bytes) else b"".join(got)
            await self.finish(f)
        return out

    async def finish(self, f: http.HTTPFlow, body: bytes | None = None) -> None:
        """The end of the response: the `response` hook (a body not streamed is set first)."""
        if body is not None and f.response is not None:
            f.response.content = body
        await self.addon.response(f)
        self.tap_addon.response(f)

    def error(self, f: http.HTTPFlow, msg: str | None = None) -> None:
        """The flow failed (`msg`), or was killed by the addon (`None`: its error is set already)."""
        from mitmproxy import flow as mflow

        if msg is not None:
            f.error = mflow.Error(msg)
        self.addon.error(f)
        self.tap_addon.error(f)

    def done(self) -> None:
        self.addon.done()
        self.tap_addon.done()

    # ------------------------------------------------------------------ the tap

    def tap(self, **match: Any) -> list[dict[str, Any]]:
        if not self.tap_path.exists():
            return []
        out = []
        # As the checker reads the tap: short forms expanded (lab.checker.inputs.tap_forms).
        lines = [json.loads(line) for line in self.tap_path.read_text().splitlines()]
        for r in expand_all(lines):
            if all(r.get(k) == v for k, v in match.items()):
                out.append(r)
        return out


def decode(raw: bytes) -> list[SseEvent]:
    d = SseDecoder()
    evs = d.feed(raw)
    d.end_of_stream()
    return evs


def rpc(method: str, rid: int | None = 1, **params: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rid is not None:
        m["id"] = rid
    return m


def call(tool: str, rid: int = 1, key: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"progressToken": rid}
    if key is not None:
        meta["mcp-lab/idempotency-key"] = key
    return rpc("tools/call", rid, name=tool, arguments={}, _meta=meta)


def sse_stream(
    stream_id: str, n: int, *, rid: int = 1, tag: str = "AAAAAAAAAAA", priming: bool = True
) -> list[bytes]:
    """A POST stream as the reference server sends it: priming, n progress, the response.

    IDs are e1-shaped (the MAC is not checked by the proxy).
    """
    out = []
    seq = 0
    if priming:
        out.append(encode_event("", id=_eid(tag, stream_id, seq, "")))
        seq += 1
    for i in range(n):
        data = json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": i + 1}}
        )
        out.append(encode_event(data, id=_eid(tag, stream_id, seq, data)))
        seq += 1
    data = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"ok": True}})
    out.append(encode_event(data, id=_eid(tag, stream_id, seq, data)))
    return out


def _eid(tag: str, stream_id: str, seq: int, data: str) -> str:
    from lab.wire.event_ids import message_digest

    return f"e1.{tag}.0.{stream_id}.{seq}.{message_digest(data)[:12]}.{'M' * 16}"
