"""MCP Streamable HTTP fault injection: mitmproxy's hooks, adapted to the fault kinds.

    .venv/bin/mitmdump -q --mode reverse:http://127.0.0.1:PORT --listen-host 127.0.0.1 --listen-port 0 --set connection_strategy=lazy -s addons/mcp_faults.py --set mcpfaults_plan=results/RUN/proxy/plan.json --set mcpfaults_tap=results/RUN/proxy/tap.jsonl

What each fault does is its kind's (lab/faults/kinds, docs/faults.md); this file only
carries the effects out. It loads the tap (addons/mcp_tap.py) alongside itself. The plan
may change during a run: replace the file atomically, or `set mcpfaults_plan=...`.
When ready it prints `mcp_faults listening on http://HOST:PORT` (flushed).
"""

# No `from __future__ import annotations` (see addons/mcp_tap.py).
import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable

import mcp_faults_io as proxy_io
from mcp_tap import McpTap
from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader

from lab.faults.balance import Balancer
from lab.faults.events import Armed, EventFaults
from lab.faults.flows import FlowFaults
from lab.faults.kinds import base as k
from lab.faults.memory import Memory
from lab.faults.pins import Ordinals
from lab.faults.plan import ActivePlan, Plan, PlanHolder
from lab.faults.records import METADATA_KEY, plan_error_record, plan_record
from lab.wire.extensions import LAB_FAULT_HEADER
from lab.wire.revisions import LAST_EVENT_ID_HEADER, SESSION_HEADER

log = logging.getLogger(__name__)
OPTIONS = (  # name, default, help; numbers are strings: mitmproxy's --set parses only str, int, bool
    ("mcpfaults_plan", "", "Fault plan (mcpLabFaultPlan.v1): a JSON file path, or inline JSON."),
    ("mcpfaults_run_start", "", "Epoch seconds fault windows count from; empty = the plan's, else now."),
    ("mcpfaults_admin_token", "", "Admin token of the reference server; empty = env LAB_ADMIN_TOKEN."),
    ("mcpfaults_admin_url", "", "Expire control URL; empty = the upstream's /lab-admin/expire."),
    ("mcpfaults_admin_timeout", "2", "Seconds a side call (expire control, DELETE) may take."),
    ("mcpfaults_poll", "1", "Seconds between checks of the plan file for changes."),
    (
        "mcpfaults_replicas",
        "",
        "Comma-separated host:port upstreams to balance over; empty = the one upstream.",
    ),
    (
        "mcpfaults_affinity",
        "none",
        "none: round-robin per request; session: a session's requests to its replica.",
    ),
)


class McpFaults:
    def __init__(self, tap: McpTap) -> None:
        self.tap, tap.layer = tap, self
        self.holder, self.memory, self.env = PlanHolder(), Memory(), k.ProxyEnv()
        self.ordinals = Ordinals()  # each client's requests by kind, for pinned faults
        self.balancer: Balancer | None = None
        """The replicas a request is routed to (`mcpfaults_replicas`); None: the one upstream."""
        self.flows: dict[str, FlowFaults] = {}
        self.clock: Callable[[], float] = time.time
        self.cutter: Callable[[http.HTTPFlow], None] = proxy_io.cut_client_connection
        self.caller: Callable[[k.HttpCall], Awaitable[int]] = proxy_io.http_call
        self.plan_file, self.run_start, self._started = proxy_io.PlanFile(None, 1.0), 0.0, time.time()
        self._tasks: set[asyncio.Future[None]] = set()

    def load(self, loader: Loader) -> None:
        for name, default, text in OPTIONS:
            loader.add_option(name, str, default, text)

    def configure(self, updated: set[str]) -> None:
        try:
            opts = proxy_io.parse_fault_options({name: getattr(ctx.options, name) for name, _, _ in OPTIONS})
        except ValueError as e:
            raise proxy_io.options_error(str(e)) from None
        self.env, self.run_start, self.plan_file.poll = opts.env, opts.run_start, opts.poll
        if {"mcpfaults_replicas", "mcpfaults_affinity"} & updated:  # else keep what it learnt
            self.balancer = Balancer(opts.replicas, opts.affinity) if opts.replicas else None
        if {"mcpfaults_plan", "mcpfaults_run_start"} & updated:
            self.plan_file = proxy_io.PlanFile(opts.path, opts.poll)
            self._activate(opts.plan, str(opts.path) if opts.path else "option")

    def running(self) -> None:
        # Answers made by the proxy (storms) must not open an upstream connection.
        if ctx.options.connection_strategy != "lazy":
            ctx.options.update(connection_strategy="lazy")  # type: ignore[no-untyped-call]
        proxy_io.announce("mcp_faults")

    def done(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _activate(self, plan: Plan, source: str) -> None:
        run_start = self.run_start or plan.run_start or self._started
        self.holder.active = active = ActivePlan(plan, run_start, self.holder.active.version + 1)
        self.tap.emit(plan_record(plan, self.clock(), source, active.version, run_start))
        self.tap.flush()

    # ------------------------------------------------------------------ hooks

    def request(self, flow: http.HTTPFlow) -> None:
        now = self.clock()
        try:
            plan = self.plan_file.changed(now)
            if plan is not None:
                self._activate(plan, str(self.plan_file.path))
        except ValueError as e:
            log.error(f"mcp_faults: keeping the current plan: {e}")
            self.tap.emit(plan_error_record(now, str(self.plan_file.path), str(e)))
        if len(self.flows) > 200_000:  # flows whose end we never saw: forget the oldest
            for old in list(self.flows)[:1000]:
                del self.flows[old]
        ff = self.flows[flow.id] = FlowFaults(self.tap.facts(flow))  # facts: before any rewrite
        flow.metadata[METADATA_KEY] = ff.meta
        answer = ff.on_request(
            self.holder.active,
            self.env,
            flow.request.headers,
            self.memory,
            self.tap.redactor.token,
            now,
            self.ordinals,
        )
        if answer is not None:  # the proxy answers itself: no replica
            flow.response = http.Response.make(answer.status, answer.body, dict(answer.headers))
            flow.response.headers[LAB_FAULT_HEADER] = ff.fault_tag() or ""
        elif self.balancer is not None:  # replicas off: this one test is all they cost a request
            self._route(flow, ff, self.balancer)
        self.tap.flush()

    def _route(self, flow: http.HTTPFlow, ff: FlowFaults, balancer: Balancer) -> None:
        """Send the request to a replica. It routes what goes upstream, after the request
        faults: a request whose session ID a fault removed is routed as one without."""
        req = flow.request
        k = balancer.route(req.headers.get(SESSION_HEADER) if balancer.by_session else None)
        replica = balancer.replicas[k]
        # Setting host and port also rewrites the Host header (mitmproxy), as reverse mode
        # does for its one upstream; mitmproxy opens (or reuses) a connection to it.
        req.host, req.port = replica.host, replica.port
        ff.meta["replica"] = k

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ff, resp = self.flows.get(flow.id), flow.response
        if ff is None or resp is None:
            return
        tag = ff.fault_tag()
        if tag is not None:  # the client may tell the lab's doing from the target's failures
            resp.headers[LAB_FAULT_HEADER] = tag
        sid_out = resp.headers.get(SESSION_HEADER)
        if sid_out:  # only an initialize's answer carries one: other answers cost no more than before
            if ff.facts.token:
                self.memory.remember_token(self.tap.redactor.session(sid_out) or "", ff.facts.token)
            replica = ff.meta.get("replica")
            if replica is not None and self.balancer is not None:
                self.balancer.learn(sid_out, replica)  # this replica holds the session now
        sse = resp.headers.get("content-type", "").lower().startswith("text/event-stream")
        if ff.on_head(resp.status_code, sse) is not None:
            proxy_io.kill(flow)
        elif sse:
            race = functools.partial(self._race_soon, flow, ff)  # as the response event passes
            ff.stream(self.holder, self.memory, flow.request.headers.get(LAST_EVENT_ID_HEADER), race)

    async def response(self, flow: http.HTTPFlow) -> None:
        ff, resp = self.flows.pop(flow.id, None), flow.response
        if ff is None or resp is None or callable(resp.stream) or ff.meta["answered_by"] != "server":
            return  # streamed: its events met the faults as they passed
        sse = resp.headers.get("content-type", "").lower().startswith("text/event-stream")
        todo = ff.on_body(resp.status_code, sse, resp.content or b"")
        if isinstance(todo, k.Kill):
            return proxy_io.kill(flow)
        for a, wait in todo:
            race = self._race(flow, ff, a)
            if wait and race is not None:
                await race  # held back by awaiting, never by blocking the loop
            else:
                self._start(race)
        return None

    def error(self, flow: http.HTTPFlow) -> None:
        self.flows.pop(flow.id, None)

    # ------------------------------------------------------------------ the tap's questions (FaultLayer)

    def event_faults(self, flow: http.HTTPFlow) -> EventFaults | None:
        ff = self.flows.get(flow.id)
        return ff.events if ff is not None else None

    def holds(self, flow: http.HTTPFlow) -> bool:
        ff = self.flows.get(flow.id)
        return ff is not None and ff.holds()

    def cut(self, flow: http.HTTPFlow) -> None:
        flow.metadata.setdefault(METADATA_KEY, {})["cut"] = True
        if flow.response is not None and callable(flow.response.stream):
            self.cutter(flow)
        else:
            proxy_io.kill(flow)  # a held answer: nothing of it was sent yet

    # ------------------------------------------------------------------ side calls

    def _race(self, flow: http.HTTPFlow, ff: FlowFaults, a: Armed) -> Awaitable[None] | None:
        """A race's side call, then its tap `fault` record (None: it cannot be made)."""
        req = flow.request
        upstream, replica = k.Upstream(req.host, req.port, req.path, req.headers), None
        if self.balancer is not None:
            upstream, replica = self._home_upstream(flow, ff, self.balancer)
        call = ff.side_call(a, upstream, self.env)
        if call is None:
            return None

        async def run() -> None:
            record = ff.fault_record(a, await self.caller(call), self.clock())
            if replica is not None and (call.host, call.port) == (upstream.host, upstream.port):
                record["replica"] = replica  # where it went (not to an mcpfaults_admin_url elsewhere)
            self.tap.emit(record)
            self.tap.flush()

        return run()

    @staticmethod
    def _home_upstream(flow: http.HTTPFlow, ff: FlowFaults, balancer: Balancer) -> tuple[k.Upstream, int]:
        """The upstream of a side call when balancing, and its replica index.

        A call about a session (kill_session's DELETE, expiry_race's admin call) goes to the
        session's replica when the balancer knows it, else to the replica that answered
        the request being raced (it just served the session), else the first replica
        (`Balancer.home`): ending the session anywhere else would end nothing."""
        req = flow.request
        home = balancer.home(ff.facts.session_id, ff.meta.get("replica"))
        replica = balancer.replicas[home]
        headers = req.headers
        if (replica.host, replica.port) != (req.host, req.port):
            headers = req.headers.copy()  # the call names its own upstream in its Host header
            headers["host"] = replica.authority
        return k.Upstream(replica.host, replica.port, req.path, headers), home

    def _race_soon(self, flow: http.HTTPFlow, ff: FlowFaults, a: Armed) -> None:
        self._start(self._race(flow, ff, a))

    def _start(self, race: Awaitable[None] | None) -> None:
        if race is not None:
            task = asyncio.ensure_future(race)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


tap = McpTap()
addons = [McpFaults(tap), tap]
