"""The ground-truth tap (`mcpLabTap.v1`): what the server sent and what the client got.

    .venv/bin/mitmdump -q --mode reverse:http://127.0.0.1:PORT --listen-host 127.0.0.1 --listen-port 0 -s addons/mcp_tap.py --set mcpfaults_tap=results/RUN/proxy/tap.jsonl

Alone it records the traffic as it passes. addons/mcp_faults.py loads it alongside itself
and attaches its fault layer (`FaultLayer`): the tap owns each SSE response's pipe, so it
records every event as the server sent it, before any fault, and as forwarded, after.
Records are in docs/ledgers.md; each hook's and each chunk's records reach the OS in one
unbuffered write(2) before it returns. When ready it prints `mcp_tap listening on ...`.
"""

# No `from __future__ import annotations`: mitmproxy runs this file as a module that is not
# in sys.modules yet, and dataclasses cannot resolve string annotations there.
import asyncio
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from mcp_faults_io import (
    TapFile,
    announce,
    bound_response_heads,
    cut_client_connection,
    options_error,
    parse_key,
    parse_origin_patterns,
)
from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from lab.faults.declarations import InitializeWatch, ToolsWatch, client_declaration
from lab.faults.events import EventFaults
from lab.faults.facts import RequestFacts, bearer_token, read_request
from lab.faults.pipeline import MessageWatch, Record, SsePipe
from lab.faults.records import METADATA_KEY, flow_record
from lab.faults.results import ResultWatch, WriteCall, WriteCalls
from lab.logscrub import scrub_stderr
from lab.wire.jsonrpc import DISCOVER, INITIALIZE
from lab.wire.redact import Redactor
from lab.wire.revisions import SESSION_HEADER

OPTIONS: Final = (  # name, default, help
    ("mcpfaults_tap", "", "Path of the tap (mcpLabTap.v1 JSON lines); empty = none."),
    ("mcpfaults_key", "", "Hex key for session/token pseudonyms; empty = env LAB_LEDGER_KEY."),
    (
        "mcpfaults_allowed_origins",
        "",
        "The server's Origin allow-list (`:*` = any port), for origin_allowed_out.",
    ),
)


class FaultLayer(Protocol):
    """What the tap asks the fault addon (addons/mcp_faults.py) about a flow."""

    def event_faults(self, flow: http.HTTPFlow) -> EventFaults | None: ...
    def holds(self, flow: http.HTTPFlow) -> bool: ...
    def cut(self, flow: http.HTTPFlow) -> None: ...


@dataclass(slots=True)
class TapFlow:
    facts: RequestFacts
    write: WriteCall | None = None
    pipe: SsePipe | None = None
    held: bool = False
    head_written: bool = False
    declared: list[str] | None = None
    """An initialize's: the capabilities its request declared (the client's)."""
    flow: http.HTTPFlow | None = None
    """The flow itself, while it is open: a flow still open when the proxy stops gets its
    `flow` record then (status null), so that its request is known, not only its end."""


class McpTap:
    def __init__(self) -> None:
        self.redactor = Redactor(secrets.token_bytes(32))
        self.layer: FaultLayer | None = None
        self.file: TapFile | None = None
        self.records: list[Record] = []
        self.flows: dict[str, TapFlow] = {}
        self.writes = WriteCalls()
        self.clock: Callable[[], float] = time.time
        self.allowed_origins: tuple[str, ...] = ()
        self.configured = False
        """Whether the tap option was read: until then records wait (the fault addon's come first)."""

    def load(self, loader: Loader) -> None:
        scrub_stderr()  # no token or session ID in mitmdump's log, whoever prints it
        bound_response_heads()  # a target's endless headers must not take our memory
        for name, default, text in OPTIONS:
            loader.add_option(name, str, default, text)

    def configure(self, updated: set[str]) -> None:
        o = ctx.options
        try:
            self.allowed_origins = parse_origin_patterns(o.mcpfaults_allowed_origins)
            key_hex = o.mcpfaults_key or os.environ.get("LAB_LEDGER_KEY", "")
            if key_hex:
                self.redactor = Redactor(parse_key(key_hex))
        except ValueError as e:
            raise options_error(str(e)) from None
        if "mcpfaults_tap" in updated:
            if self.file is not None:
                self.flush()
                self.file.close()
                self.file = None
            if o.mcpfaults_tap:
                try:
                    self.file = TapFile(Path(o.mcpfaults_tap))
                except OSError as e:
                    raise options_error(f"cannot open the tap {o.mcpfaults_tap}: {e}") from None
            self.configured = True
            self.flush()  # records made before the file was opened (the first plan) go to it

    def running(self) -> None:
        if self.layer is None:
            announce("mcp_tap")

    def done(self) -> None:
        for flow_id, st in list(self.flows.items()):
            if st.flow is not None:
                self._head(st.flow, st)
            self._end(flow_id, "proxy_stopped")
        self.flush()
        if self.file is not None:
            self.file.close()
            self.file = None

    # ------------------------------------------------------------------ shared with the fault addon

    def emit(self, record: Record) -> None:
        self.records.append(record)

    def flush(self) -> None:
        """Hand the pending records to the OS now, in one write(2)."""
        if self.records and (self.file is not None or self.configured):
            if self.file is not None:
                self.file.write(self.records)
            self.records.clear()

    def facts(self, flow: http.HTTPFlow) -> RequestFacts:
        """What the request said as the client sent it (read once, before any fault rewrites it)."""
        st = self.flows.get(flow.id)
        if st is None:
            if len(self.flows) > 200_000:  # flows whose end we never saw: forget the oldest
                for old in list(self.flows)[:1000]:
                    del self.flows[old]
            req = flow.request
            facts = read_request(flow.id, req.method, req.path, req.headers, req.raw_content, self.redactor)
            st = self.flows[flow.id] = TapFlow(facts, flow=flow)
        return st.facts

    # ------------------------------------------------------------------ hooks

    def request(self, flow: http.HTTPFlow) -> None:
        f = self.facts(flow)
        if f.rpc.method in (INITIALIZE, DISCOVER):  # the modern era declares at server/discover
            self.flows[flow.id].declared = client_declaration(flow.request.raw_content)
        if f.rpc.is_write and flow.response is None:  # (a storm answered it: the server never saw it)
            auth = self.redactor.token(bearer_token(flow.request.headers.get("authorization")))
            call = WriteCall(f.rpc.id or 0, f.rpc.idempotency_key or "", f.rpc.tool or "", auth)
            self.flows[flow.id].write = call
            if f.session is not None:
                self.writes.note(f.session, call)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        self.facts(flow)  # (a flow that began before the tap was loaded)
        st, resp = self.flows[flow.id], flow.response
        if resp is not None and flow.error is None and _is_sse(resp):
            st.held = self.layer is not None and self.layer.holds(flow)
            if not st.held:  # a streamed head passes now; the others with their body
                st.pipe = self._pipe(flow, st)
                resp.stream = self._streamer(flow, st.pipe)
                self._head(flow, st)
        self.flush()

    def response(self, flow: http.HTTPFlow) -> None:
        st, resp = self.flows.get(flow.id), flow.response
        if st is None or resp is None:
            return  # ended already (cut by a fault)
        if st.held and flow.error is None:  # the fault layer held it back whole: its events pass now
            pipe = self._pipe(flow, st)
            resp.content = pipe.feed(resp.content or b"") + pipe.feed(b"")
            if pipe.cut is not None and self.layer is not None:
                self.layer.cut(flow)
        elif st.pipe is None and self._meta(flow).get("answered_by") != "proxy":
            watch = self._watch(flow, st, body=True)
            if watch is not None:
                self.records += watch.records((resp.content or b"").decode(errors="replace"), self.clock())
        self._head(flow, st)
        self._end(flow.id, "cut_by_fault" if self._meta(flow).get("cut") else "complete")
        self.flush()

    def error(self, flow: http.HTTPFlow) -> None:
        st = self.flows.get(flow.id)
        if st is not None:
            self._head(flow, st)
            gone = "client_gone" if flow.error and "client" in flow.error.msg.lower() else "server_gone"
            self._end(flow.id, "cut_by_fault" if self._meta(flow).get("cut") else gone)
            self.flush()

    # ------------------------------------------------------------------ records

    def _watch(self, flow: http.HTTPFlow, st: TapFlow, *, body: bool = False) -> MessageWatch | None:
        """What looks at the server's messages on this flow: an initialize's declarations,
        or the answers to write calls (None: nothing to look for). A JSON `body` answers
        only its own request: a write's, or nothing to look for."""
        f = st.facts
        if st.declared is not None:
            resp = flow.response
            sid = resp.headers.get(SESSION_HEADER) if resp is not None else None
            return InitializeWatch(flow.id, self.redactor.session(sid), st.declared)
        inner = (
            ResultWatch(flow.id, f.session, st.write, self.writes)
            if st.write or (f.session and not body)
            else None
        )
        if f.rpc.method == "tools/list":  # the tools' annotations: the retry rule's
            return ToolsWatch(flow.id, f.session, inner)
        return inner

    def _pipe(self, flow: http.HTTPFlow, st: TapFlow) -> SsePipe:
        f = st.facts
        faults = self.layer.event_faults(flow) if self.layer is not None else None
        return SsePipe(
            flow.id, f.session, self.records, self.clock, faults=faults, results=self._watch(flow, st)
        )

    def _streamer(self, flow: http.HTTPFlow, pipe: SsePipe) -> Callable[[bytes], list[bytes]]:
        # Returns a list, never b"": mitmproxy 12 sends an empty bytes chunk as an empty
        # HTTP/1.1 chunk, which is the chunked body's terminator and ends the stream early.
        pending = False

        def cut() -> None:
            nonlocal pending
            if pending and self.layer is not None:
                pending = False
                self.layer.cut(flow)

        def stream(chunk: bytes) -> list[bytes]:
            nonlocal pending
            cut()  # the next chunk (or the end) came before the scheduled cut: what we returned is written
            was_cut, was_over = pipe.cut is not None, pipe.over_limit is not None
            out = pipe.feed(chunk)
            if pipe.cut is not None and not was_cut:
                flow.metadata.setdefault(METADATA_KEY, {})["cut"] = True
                self._end(flow.id, "cut_by_fault")
                pending = True
                asyncio.get_running_loop().call_soon(cut)  # once mitmproxy wrote what we return now
            elif pipe.over_limit is not None and not was_over:
                # The target's event outgrew the pipe's bound: its client gets no more of it.
                self._end(flow.id, "event_over_limit")
                asyncio.get_running_loop().call_soon(cut_client_connection, flow)
            self.flush()
            return [out] if out else []

        return stream

    @staticmethod
    def _meta(flow: http.HTTPFlow) -> dict[str, Any]:
        meta: dict[str, Any] = flow.metadata.get(METADATA_KEY, {})
        return meta

    def _head(self, flow: http.HTTPFlow, st: TapFlow) -> None:
        """The `flow` record: once per flow, when the response head passes (or it never will)."""
        if not st.head_written:
            st.head_written = True
            resp, meta, origins = flow.response, self._meta(flow), self.allowed_origins
            status, sid_out = (resp.status_code, resp.headers.get(SESSION_HEADER)) if resp else (None, None)
            record = flow_record(
                st.facts, self.clock(), flow.request.headers, status, sid_out, meta, origins, self.redactor
            )
            record["t_request"] = flow.request.timestamp_start  # when the request reached the proxy
            self.records.append(record)

    def _end(self, flow_id: str, reason: str) -> None:
        if self.flows.pop(flow_id, None) is not None:
            self.records.append({"type": "flow_end", "flow": flow_id, "t": self.clock(), "reason": reason})


def _is_sse(resp: http.Response) -> bool:
    ctype: str = resp.headers.get("content-type", "")
    return ctype.lower().startswith("text/event-stream")


addons = [McpTap()]
