"""MCP Streamable HTTP fault injection and the ground-truth tap, as one mitmproxy addon.

    .venv/bin/mitmdump -q --mode reverse:http://127.0.0.1:PORT --listen-host 127.0.0.1 --listen-port 0 --set connection_strategy=lazy -s addons/mcp_faults.py --set mcpfaults_plan=results/RUN/proxy/plan.json --set mcpfaults_tap=results/RUN/proxy/tap.jsonl

The faults and the plan format are in `lab/faults/plan.py` and docs/faults.md; the tap
format (`mcpLabTap.v1`) in docs/ledgers.md. Changing faults during a run: replace the
plan file atomically (write a temporary file, then rename it over the old one); the
addon notices within `mcpfaults_poll` seconds, and keeps the old plan (and writes a
`plan` record with the error to the tap) if the new one is invalid. mitmproxy's own
`set mcpfaults_plan=...` works too (mitmweb, console).

When ready it prints `mcp_faults listening on http://HOST:PORT` (flushed).
"""

# No `from __future__ import annotations` here: mitmproxy executes this file as a module that
# is not in sys.modules yet, and dataclasses cannot resolve string annotations there.
import asyncio
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mcp_faults_io import (
    ADMIN_PATH,
    SESSION_HEADER,
    AdminCall,
    Tap,
    addon,
    admin_expire,
    check_admin_url,
    cut_client_connection,
    dumps,
    kill,
    options_error,
    parse_key,
    parse_origin_patterns,
    parse_seconds,
    raise_listen_backlog,
    read_plan,
)
from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from lab.faults.facts import (
    RequestFacts,
    bearer_token,
    decision_key,
    garbage_id,
    origin_allowed,
    rpc_facts,
    tampered_id,
)
from lab.faults.pipeline import (
    ActivePlan,
    Fired,
    Memory,
    PipeContext,
    PlanHolder,
    Record,
    SsePipe,
)
from lab.faults.plan import (
    Decision,
    ExpiryParams,
    FaultKind,
    LastEventIdParams,
    OriginParams,
    Plan,
    Rule,
    StormParams,
    Unit,
)
from lab.wire.extensions import LAB_CONN_HEADER
from lab.wire.redact import Redactor

log = logging.getLogger(__name__)

VERSION_HEADER: Final = "mcp-protocol-version"
LAST_EVENT_ID_HEADER: Final = "last-event-id"
METADATA_KEY: Final = "mcp_lab"
"""flow.metadata[METADATA_KEY]: {"key", "stream", "faults": [{"fault", "rule", "decision"}...],
"answered_by", "cut"} — what this addon did to the flow, for other addons and for people."""

# Flow-level faults in the order they are tried on a request (a storm answers it alone).
_ORDER: Final = {
    k: i for i, k in enumerate([FaultKind.STORM, *(k for k in FaultKind if k is not FaultKind.STORM)])
}


# ---------------------------------------------------------------------- per-flow state


@dataclass(slots=True)
class FlowState:
    facts: RequestFacts
    faults: list[dict[str, Any]] = field(default_factory=list)
    armed: dict[FaultKind, tuple[Rule, Decision]] = field(default_factory=dict)
    answered_by: str = "server"
    origin_rewritten: bool = False
    head_written: bool = False
    ended: bool = False
    killed: bool = False
    cut_pending: bool = False
    pipe: SsePipe | None = None

    def add(self, fired: Fired, detail: dict[str, Any] | None = None) -> None:
        tag: dict[str, Any] = fired.tag()
        if detail:
            tag["detail"] = detail
        self.faults.append(tag)


class McpFaults:
    """Injects the faults of the plan and writes the tap. See the module docstring."""

    def __init__(self) -> None:
        self.holder = PlanHolder()
        self.memory = Memory()
        self.redactor = Redactor(secrets.token_bytes(32))
        self.tap: Tap | None = None
        self.flows: dict[str, FlowState] = {}
        self.records: list[Record] = []
        self.clock: Callable[[], float] = time.time
        self.cutter: Callable[[http.HTTPFlow], None] = cut_client_connection
        self.expirer: Callable[[AdminCall], int] = admin_expire
        self.allowed_origins: tuple[str, ...] = ()
        self._started = time.time()
        self._plan_path: Path | None = None
        self._plan_stamp: tuple[int, int, int] | None = None
        self._next_check = 0.0
        self._flow_rules: tuple[Rule, ...] = ()
        self.run_start = 0.0
        self.poll = 1.0
        self.admin_timeout = 2.0

    # ------------------------------------------------------------------ options

    def load(self, loader: Loader) -> None:
        loader.add_option(
            "mcpfaults_plan", str, "", "Fault plan (mcpLabFaultPlan.v1): a JSON file path, or inline JSON."
        )
        loader.add_option(
            "mcpfaults_tap", str, "", "Path of the tap (mcpLabTap.v1 JSON lines); empty = none."
        )
        # Numbers are string options: mitmproxy's --set parses only str, int and bool.
        loader.add_option(
            "mcpfaults_run_start",
            str,
            "",
            "Epoch seconds that fault windows count from; empty = the plan's run_start, else the addon's start.",
        )
        loader.add_option(
            "mcpfaults_key", str, "", "Hex key for session/token pseudonyms; empty = env LAB_LEDGER_KEY."
        )
        loader.add_option(
            "mcpfaults_admin_token",
            str,
            "",
            "Admin token of the reference server; empty = env LAB_ADMIN_TOKEN.",
        )
        loader.add_option(
            "mcpfaults_admin_url", str, "", "Expire control URL; empty = the upstream's /lab-admin/expire."
        )
        loader.add_option("mcpfaults_admin_timeout", str, "2", "Seconds to wait for the expire control.")
        loader.add_option(
            "mcpfaults_allowed_origins",
            str,
            "",
            "Comma-separated Origin allow-list of the server (`:*` = any port), for origin_allowed_out; empty = unknown.",
        )
        loader.add_option("mcpfaults_poll", str, "1", "Seconds between checks of the plan file for changes.")

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("mcpfaults_") for name in updated):
            return
        o = ctx.options
        try:
            run_start = parse_seconds("mcpfaults_run_start", o.mcpfaults_run_start, default=0.0)
            poll = parse_seconds("mcpfaults_poll", o.mcpfaults_poll, default=1.0, positive=True)
            timeout = parse_seconds(
                "mcpfaults_admin_timeout", o.mcpfaults_admin_timeout, default=2.0, positive=True
            )
            check_admin_url(o.mcpfaults_admin_url)
            self.allowed_origins = parse_origin_patterns(o.mcpfaults_allowed_origins)
            key_hex = o.mcpfaults_key or os.environ.get("LAB_LEDGER_KEY", "")
            if key_hex:
                self.redactor = Redactor(parse_key(key_hex))
            elif "mcpfaults_key" in updated:
                log.warning("mcp_faults: no LAB_LEDGER_KEY: pseudonyms use a random key and join nothing")
            plan, path = read_plan(o.mcpfaults_plan)
        except ValueError as e:
            raise options_error(str(e)) from None
        self.run_start, self.poll, self.admin_timeout = run_start, poll, timeout
        if "mcpfaults_tap" in updated:
            if self.tap is not None:
                self._flush()
                self.tap.close()
                self.tap = None
            if o.mcpfaults_tap:
                try:
                    self.tap = Tap(Path(o.mcpfaults_tap))
                except OSError as e:
                    raise options_error(f"cannot open the tap {o.mcpfaults_tap}: {e}") from None
        if {"mcpfaults_plan", "mcpfaults_run_start"} & updated:
            self._plan_path = path
            self._plan_stamp = self._stamp(path)
            self._activate(plan, str(path) if path else "option")

    def running(self) -> None:
        # Answers made by the proxy (storms) must not open an upstream connection.
        if ctx.options.connection_strategy != "lazy":
            ctx.options.update(connection_strategy="lazy")  # type: ignore[no-untyped-call]
        ps = addon("proxyserver")
        for addr in ps.listen_addrs() if ps is not None else []:
            raise_listen_backlog(addr[0], addr[1])
            print(f"mcp_faults listening on http://{addr[0]}:{addr[1]}", flush=True)

    def done(self) -> None:
        now = self.clock()
        for fid, st in list(self.flows.items()):
            if not st.ended:
                self._end(fid, st, "proxy_stopped", now)
        self._flush()
        if self.tap is not None:
            self.tap.close()
            self.tap = None

    # ------------------------------------------------------------------ plan

    @staticmethod
    def _stamp(path: Path | None) -> tuple[int, int, int] | None:
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _activate(self, plan: Plan, source: str) -> None:
        run_start = self.run_start or plan.run_start or self._started
        version = self.holder.active.version + 1
        self.holder.active = ActivePlan(plan, run_start, version)
        self._flow_rules = tuple(
            sorted((r for r in plan.rules if r.unit is Unit.FLOW), key=lambda r: _ORDER[r.kind])
        )
        self._record(
            {
                "type": "plan",
                "t": self.clock(),
                "source": source,
                "digest": plan.digest,
                "version": version,
                "seed": plan.seed,
                "run_start": run_start,
                "rules": [{"id": r.id, "kind": str(r.kind), "rate": r.rate} for r in plan.rules],
                "error": None,
            }
        )
        self._flush()

    def _maybe_reload(self, now: float) -> None:
        if self._plan_path is None or now < self._next_check:
            return
        self._next_check = now + self.poll
        stamp = self._stamp(self._plan_path)
        if stamp is None or stamp == self._plan_stamp:
            return
        self._plan_stamp = stamp
        try:
            plan, _ = read_plan(str(self._plan_path))
        except ValueError as e:
            log.error(f"mcp_faults: keeping the current plan: {e}")
            self._record(
                {"type": "plan", "t": now, "source": str(self._plan_path), "digest": None, "error": str(e)}
            )
            self._flush()
            return
        self._activate(plan, str(self._plan_path))

    # ------------------------------------------------------------------ tap helpers

    def _record(self, record: dict[str, Any]) -> None:
        self.records.append(dumps(record))

    def _flush(self) -> None:
        """Hand the pending records to the OS now, in one write(2): every hook and every
        streamed chunk ends with this, so a crash of the proxy loses no finished line."""
        if self.records:
            if self.tap is not None:
                self.tap.write(self.records)
            self.records.clear()

    def _state(self, flow: http.HTTPFlow) -> FlowState:
        st = self.flows.get(flow.id)
        if st is None:
            # A flow that began before this addon was loaded (or a test that skips hooks).
            st = self.flows[flow.id] = FlowState(self._facts(flow))
        return st

    def _facts(self, flow: http.HTTPFlow) -> RequestFacts:
        req = flow.request
        h = req.headers
        method = req.method.upper()
        rpc = rpc_facts(req.raw_content) if method == "POST" else rpc_facts(None)
        conn = h.get(LAB_CONN_HEADER)
        lei = h.get(LAST_EVENT_ID_HEADER)
        sid = h.get(SESSION_HEADER)
        return RequestFacts(
            flow=flow.id,
            key=decision_key(conn, method, req.path, rpc, lei),
            conn=conn,
            http_method=method,
            path=req.path,
            session_id=sid,
            session=self.redactor.session(sid),
            rpc=rpc,
            origin=h.get("origin"),
            last_event_id=lei,
            protocol_version=h.get(VERSION_HEADER),
            token=bearer_token(h.get("authorization")),
        )

    def _tag(self, flow: http.HTTPFlow, st: FlowState, **extra: Any) -> None:
        meta = flow.metadata.setdefault(METADATA_KEY, {})
        meta.update(key=st.facts.key, stream=st.facts.stream, faults=st.faults, answered_by=st.answered_by)
        meta.update(extra)

    def _origin_allowed(self, st: FlowState, origin: str | None) -> bool | None:
        if st.origin_rewritten:
            return False
        if origin is None or not self.allowed_origins:
            return None
        return origin_allowed(origin, self.allowed_origins)

    def _head(self, flow: http.HTTPFlow, st: FlowState, now: float) -> None:
        """The `flow` record: once per flow, when the response head passes (or it never will)."""
        if st.head_written:
            return
        st.head_written = True
        f, h = st.facts, flow.request.headers
        resp = flow.response
        origin_out = h.get("origin")
        sid_out = resp.headers.get(SESSION_HEADER) if resp is not None else None
        self._record(
            {
                "type": "flow",
                "flow": f.flow,
                "t": now,
                "conn": f.conn,
                "method": f.http_method,
                "path": f.path,
                "stream": f.stream,
                "session": f.session,
                "session_out": self.redactor.session(sid_out),
                "jsonrpc_id": f.rpc.id,
                "jsonrpc_method": f.rpc.method,
                "tool": f.rpc.tool,
                "idempotency_key": f.rpc.idempotency_key,
                "origin_in": f.origin,
                "origin_out": origin_out,
                "origin_allowed_out": self._origin_allowed(st, origin_out),
                "last_event_id_in": f.last_event_id,
                "last_event_id_out": h.get(LAST_EVENT_ID_HEADER),
                "protocol_version_in": f.protocol_version,
                "protocol_version_out": h.get(VERSION_HEADER),
                "auth_in": self.redactor.token(f.token),
                "auth_out": self.redactor.token(bearer_token(h.get("authorization"))),
                "status": resp.status_code if resp is not None else None,
                "answered_by": st.answered_by,
                "faults": st.faults,
            }
        )

    def _end(self, fid: str, st: FlowState, reason: str, now: float) -> None:
        if st.ended:
            return
        st.ended = True
        self._record({"type": "flow_end", "flow": fid, "t": now, "reason": reason})
        self.flows.pop(fid, None)

    # ------------------------------------------------------------------ hooks

    def request(self, flow: http.HTTPFlow) -> None:
        now = self.clock()
        self._maybe_reload(now)
        if len(self.flows) > 200_000:
            # Flows whose end we never saw (their connection was torn down): forget the oldest.
            for fid in list(self.flows)[:1000]:
                del self.flows[fid]
        st = self.flows[flow.id] = FlowState(self._facts(flow))
        active = self.holder.active
        target = st.facts.target
        for rule in self._flow_rules:
            if not rule.match.matches(target) or not self._applies(rule, st):
                continue
            d = active.decide(rule, st.facts.key, now)
            if d is None:
                continue
            if rule.kind is FaultKind.STORM:
                self._storm(flow, st, rule, d, now)
                break
            if rule.kind in (
                FaultKind.DROP_PRIMING,
                FaultKind.EXECUTED_THEN_LOST,
                FaultKind.LOSE_DELETE_RESPONSE,
                FaultKind.EXPIRY_RACE,
            ):
                st.armed.setdefault(rule.kind, (rule, d))
            else:
                self._rewrite(flow, st, rule, d)
        self._tag(flow, st)
        self._flush()

    def _applies(self, rule: Rule, st: FlowState) -> bool:
        """Whether a flow-level fault makes sense for this request at all."""
        f, k = st.facts, rule.kind
        if k is FaultKind.STRIP_PROTOCOL_VERSION:
            return f.protocol_version is not None
        if k is FaultKind.REWRITE_LAST_EVENT_ID:
            return f.last_event_id is not None
        if k is FaultKind.OLD_TOKEN:
            return f.token is not None and f.session is not None
        if k is FaultKind.DROP_PRIMING:
            return f.http_method in ("POST", "GET")
        if k is FaultKind.EXECUTED_THEN_LOST:
            return f.http_method == "POST" and f.rpc.is_request
        if k is FaultKind.LOSE_DELETE_RESPONSE:
            return f.http_method == "DELETE"
        if k is FaultKind.EXPIRY_RACE:
            return f.session_id is not None and f.rpc.is_request and self._admin_token() != ""
        return True

    def _storm(self, flow: http.HTTPFlow, st: FlowState, rule: Rule, d: Decision, now: float) -> None:
        p = rule.params
        assert isinstance(p, StormParams)
        headers = {"content-type": "application/json"}
        if p.send_retry_after:
            headers["retry-after"] = str(math.ceil(p.retry_after))
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": st.facts.rpc.id,
                "error": {"code": -32000, "message": f"lab fault: {p.status} storm"},
            }
        )
        flow.response = http.Response.make(p.status, body, headers)
        st.answered_by = "proxy"
        st.add(Fired.of(rule, d), {"status": p.status, "shape": p.shape})
        self._head(flow, st, now)

    def _rewrite(self, flow: http.HTTPFlow, st: FlowState, rule: Rule, d: Decision) -> None:
        h, f, k, p = flow.request.headers, st.facts, rule.kind, rule.params
        detail: dict[str, Any] | None = None
        if k is FaultKind.REWRITE_ORIGIN and isinstance(p, OriginParams):
            h["origin"] = p.origin
            st.origin_rewritten = True
        elif k is FaultKind.STRIP_PROTOCOL_VERSION:
            del h[VERSION_HEADER]
        elif k is FaultKind.REWRITE_LAST_EVENT_ID and isinstance(p, LastEventIdParams):
            assert f.last_event_id is not None
            value, variant = self._wrong_cursor(f, p.to, d)
            h[LAST_EVENT_ID_HEADER] = value
            detail = {"to": variant}
        elif k is FaultKind.OLD_TOKEN:
            old = self.memory.other_token(f.session, f.token, d)
            if old is None:
                return  # no earlier session's token seen yet: nothing to apply
            h["authorization"] = f"Bearer {old}"
            detail = {"token": self.redactor.token(old)}
        else:
            return
        st.add(Fired.of(rule, d), detail)

    def _wrong_cursor(self, f: RequestFacts, to: str, d: Decision) -> tuple[str, str]:
        assert f.last_event_id is not None
        lei = f.last_event_id
        stream = self.memory.stream_of_id(lei) or f"flow:{f.flow}"
        names = ["other_stream", "other_session", "tampered", "garbage"]
        if to == "any":
            start = d.pick(len(names))
            order = names[start:] + names[:start]
        else:
            order = [to, "tampered", "garbage"]
        for variant in order:
            if variant == "other_stream":
                r = self.memory.other_stream(f.session, stream, d)
                if r is not None and r.event_id is not None and r.event_id != lei:
                    return r.event_id, variant
            elif variant == "other_session":
                r = self.memory.other_session(f.session, d)
                if r is not None and r.event_id is not None:
                    return r.event_id, variant
            elif variant == "tampered":
                return tampered_id(lei), variant
            else:
                break
        return garbage_id(d.id), "garbage"

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        now = self.clock()
        st = self._state(flow)
        resp = flow.response
        assert resp is not None
        f = st.facts
        sid_out = resp.headers.get(SESSION_HEADER)
        if sid_out and f.token:
            self.memory.remember_token(self.redactor.session(sid_out) or "", f.token)
        sse = resp.headers.get("content-type", "").lower().startswith("text/event-stream")
        # Only a success is "performed, then lost": a refusal (4xx/5xx) performed nothing.
        lost = st.armed.get(FaultKind.LOSE_DELETE_RESPONSE) or (
            None if sse else st.armed.get(FaultKind.EXECUTED_THEN_LOST)
        )
        if lost is not None and 200 <= resp.status_code < 300:
            st.add(Fired.of(*lost), {"status": resp.status_code})
            st.killed = True
            kill(flow)
        self._head(flow, st, now)
        if sse and not st.killed:
            active = self.holder.active
            st.pipe = SsePipe(
                PipeContext(
                    flow=flow.id,
                    key=f.key,
                    target=f.target,
                    session=f.session,
                    jsonrpc_id=f.rpc.id,
                    last_event_id=flow.request.headers.get(LAST_EVENT_ID_HEADER),
                    armed=st.armed,
                ),
                self.holder,
                self.records,
                self.clock,
                memory=self.memory if active.needs_memory else None,
                on_expire=lambda rule, d: self._expire(flow, st, rule, d),
            )
            resp.stream = self._streamer(flow, st, st.pipe)
        self._tag(flow, st)
        self._flush()

    def _streamer(self, flow: http.HTTPFlow, st: FlowState, pipe: SsePipe) -> Callable[[bytes], list[bytes]]:
        # Returns a list, never b"": mitmproxy 12 sends an empty bytes chunk as an empty
        # HTTP/1.1 chunk, which is the chunked body's terminator and ends the stream early.
        def stream(chunk: bytes) -> list[bytes]:
            if st.cut_pending:
                # The next chunk (or the end of the body) arrived before the scheduled cut:
                # what we returned earlier is written by now, and nothing more may be.
                self._cut(flow, st)
            out = pipe.feed(chunk)
            if pipe.cut is not None and not st.ended:
                st.add(pipe.cut)
                self._tag(flow, st, cut=True)
                self._end(flow.id, st, "cut_by_fault", self.clock())
                st.cut_pending = True
                # Cut once mitmproxy has written what we return for this chunk.
                asyncio.get_running_loop().call_soon(self._cut, flow, st)
            self._flush()
            return [out] if out else []

        return stream

    def _cut(self, flow: http.HTTPFlow, st: FlowState) -> None:
        if st.cut_pending:
            st.cut_pending = False
            self.cutter(flow)

    async def response(self, flow: http.HTTPFlow) -> None:
        st = self._state(flow)
        race = st.armed.get(FaultKind.EXPIRY_RACE)
        if race is not None and st.pipe is None and st.answered_by == "server":
            # A JSON (not SSE) answer: expire before it is sent on.
            call = self._admin_call(flow, st)
            if call is not None:
                status = await asyncio.to_thread(self.expirer, call)
                self._expired(flow, st, *race, status=status, order="before")
        self._head(flow, st, self.clock())
        self._end(flow.id, st, "complete", self.clock())
        self._flush()

    def error(self, flow: http.HTTPFlow) -> None:
        st = self.flows.get(flow.id)
        if st is None or st.ended:
            return
        now = self.clock()
        self._head(flow, st, now)
        msg = flow.error.msg if flow.error is not None else ""
        if st.killed:
            reason = "cut_by_fault"
        elif "client" in msg.lower():
            reason = "client_gone"
        else:
            reason = "server_gone"
        self._end(flow.id, st, reason, now)
        self._flush()

    # ------------------------------------------------------------------ expiry race

    def _admin_token(self) -> str:
        return str(ctx.options.mcpfaults_admin_token or os.environ.get("LAB_ADMIN_TOKEN", ""))

    def _admin_call(self, flow: http.HTTPFlow, st: FlowState) -> AdminCall | None:
        sid = st.facts.session_id
        token = self._admin_token()
        if sid is None or not token:
            return None
        url = ctx.options.mcpfaults_admin_url or f"http://{flow.request.host}:{flow.request.port}{ADMIN_PATH}"
        return AdminCall(url, token, sid, self.admin_timeout)

    def _expire(self, flow: http.HTTPFlow, st: FlowState, rule: Rule, d: Decision) -> None:
        """Called by the pipe as the response event passes (before it is forwarded)."""
        call = self._admin_call(flow, st)
        if call is None:
            return
        p = rule.params
        order = p.order if isinstance(p, ExpiryParams) else "before"
        if order == "before":
            # Deliberately blocking (loopback, bounded by mcpfaults_admin_timeout): the
            # session must be gone before the client can see its response.
            self._expired(flow, st, rule, d, status=self.expirer(call), order=order)
            return
        fut = asyncio.get_running_loop().run_in_executor(None, self.expirer, call)

        def finished(done: asyncio.Future[int]) -> None:
            status = done.result() if not done.cancelled() and done.exception() is None else -1
            self._expired(flow, st, rule, d, status=status, order=order)
            self._flush()

        fut.add_done_callback(finished)

    def _expired(
        self, flow: http.HTTPFlow, st: FlowState, rule: Rule, d: Decision, *, status: int, order: str
    ) -> None:
        fired = Fired.of(rule, d)
        detail = {"admin_status": status, "order": order, "session": st.facts.session}
        st.add(fired, detail)
        self._tag(flow, st)
        self._record({"type": "fault", "t": self.clock(), **fired.tag(), "flow": flow.id, "detail": detail})


addons = [McpFaults()]
