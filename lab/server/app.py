"""The reference server as a plain ASGI app: the MCP endpoint and its rules.

Order of checks for the MCP endpoint (the first failing one answers):

    Host not allowed (DNS rebinding)         421
    Origin present and not allowed           403
    method not POST/GET/DELETE               405 (Allow: GET, POST, DELETE)
    bearer token missing/unknown (if any)    401 (WWW-Authenticate: Bearer)
    request rate above --max-rps             429 + Retry-After
    MCP-Protocol-Version unsupported         400
    POST: Content-Type not JSON 415, Accept lacks JSON+SSE 406, body too large 413,
          bad JSON 400 (-32700), text that is not Unicode (a lone surrogate) 400 (-32600),
          not JSON-RPC / batch where forbidden 400 (-32600)
    GET:  Accept lacks text/event-stream     406
    no session ID (but initialize)           400
    unknown, expired or deleted session      404
    token subject is not the session's       403
    version header is not the negotiated one 400
    too many concurrent streams              503 + Retry-After
    initialize with every session busy       503 + Retry-After (max_sessions)
    a session's open streams at the limit    429 + Retry-After (max_session_streams)

Before the app sees a request, the HTTP protocol bounds its head and body (protocol.py):
431 for a head over max_header_bytes, 408 for a head or body not received in time.

Bad input never gets a 5xx; an unexpected exception is logged and answered 500 (only
if the response had not started), and the tests treat any 5xx for bad input as a bug.

Cursor rejection policy (`--cursor-policy`, the spec leaves it open): `reject` (default)
answers a GET whose Last-Event-ID is malformed, tampered, of another session or
generation, of an unknown, evicted or non-resumable stream with `--cursor-reject-status`
(400 by default; 409, 410 or 422 selectable) and a JSON-RPC error naming the verdict;
`fresh` opens a new standalone stream instead. Either way the verdict is in the ledger
(`requests.cursor_verdict`) and the client's state is CURSOR_REJECTED.

`--defect NAME` switches on one deliberate misbehaviour (defects.py); each is checked at
the one place it changes, marked `defect:` in a comment.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

from lab.server import ledger as L
from lab.server import modern
from lab.server.admin import admin_control
from lab.server.config import ServerConfig, matches
from lab.server.defects import SLOW_RESUME_S, STALL_SESSIONS, Defect
from lab.server.durable import DurableState
from lab.server.http import (
    Receive,
    Refused,
    Request,
    Scope,
    Send,
    read_json_post,
    send_empty,
    send_json,
    send_json_text,
    send_plain,
    send_refusal,
    until_disconnect,
)
from lab.server.model import LiveConn, Session, Stream
from lab.server.ratelimit import RequestRateLimiter
from lab.server.requestlog import log_request
from lab.server.sse_out import SSE_HEADERS, serve_live
from lab.server.state import Full, Resumption, ServerState
from lab.server.store import Store
from lab.server.tools import TOOL_LIST, ToolError, dispatch
from lab.wire import jsonrpc
from lab.wire.errors import RemoteProtocolError
from lab.wire.extensions import EVENT_ID_CAPABILITY
from lab.wire.revisions import (
    LAST_EVENT_ID_HEADER,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    SUPPORTED_REVISIONS,
    UNSUPPORTED_VERSION,
    negotiate,
    revision,
)
from lab.wire.sse import encode_event

log = logging.getLogger("lab.server")

SERVER_INFO = {"name": "mcp-lab-reference", "version": "0.1.0"}
STOPPING_RETRY_MS = 2000
"""The `retry` a stopping server advises on the streams it ends: about how long a restart
takes (lab run's restarts are back in 1-3 s)."""


class McpApp:
    def __init__(self, config: ServerConfig, *, path: str = "/mcp") -> None:
        config.check()
        self.config = config
        self.path = path
        self.ledger = L.Ledger(
            config.ledger_path, meta={"event_ids": config.event_ids, "defects": ",".join(config.defects)}
        )
        self.store = None if config.store is None else Store(config.store)
        self.state = (
            ServerState(config, self.ledger)
            if self.store is None
            else DurableState(config, self.ledger, self.store, time.time())
        )
        self.defects = self.state.defects
        self.rate = RequestRateLimiter(
            config.max_rps or float("inf"), burst=max(1.0, config.max_rps), now=time.time()
        )
        self.max_rps = config.max_rps
        """The request-rate limit in force (the admin control's `max_rps` knob changes it)."""
        self.open_sse = 0
        self.modern_open: dict[str | None, list[LiveConn]] = {}
        """Token subject -> its open modern-era call responses, oldest first:
        only the defect `modern-sends-after-close` reads it."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.started = False

    def capabilities(self) -> dict[str, Any]:
        """What the server declares at initialize, and so may send: tool calls, and log
        messages (`notifications/message`: ledger.append's notice, the heartbeat)."""
        caps: dict[str, Any] = {"tools": {"listChanged": False}, "logging": {}}
        if self.state.names.scheme == "e1":
            caps["experimental"] = {EVENT_ID_CAPABILITY: {"scheme": "e1"}}
        return caps

    # ------------------------------------------------------------------ ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if not self.started:
            self._start_background()
        req = Request(scope)
        started = False

        async def tracked_send(msg: Any) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            if req.path == self.path:
                await self._mcp(req, receive, tracked_send)
            elif req.path.startswith("/lab-admin/"):
                await admin_control(self, req, receive, tracked_send)
            else:
                await send_plain(tracked_send, 404, "not found")
        except Refused as r:
            self._log(req, r.status, r.reason)
            await send_refusal(tracked_send, r)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("internal error on %s %s", req.method, req.path)
            self._log(req, 500, "internal_error")
            if not started:
                await send_plain(tracked_send, 500, "internal error")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                self._start_background()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _start_background(self) -> None:
        self.started = True
        self._spawn(self._sweeper())
        if self.config.heartbeat_ms > 0:
            self._spawn(self._heartbeat())
        if self.store is not None:
            self._spawn(self.store.run_handoffs())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def end_live_connections(self) -> None:
        """End every SSE response in progress (the server is stopping); the streams stay.
        Each first advises `retry` (a server that closes a stream it goes on with says
        when to come back, as with polling): about the time a restart takes."""
        advice = encode_event(None, retry=STOPPING_RETRY_MS)
        for s in list(self.state.sessions.values()):
            for st in s.streams.values():
                sub = st.subscriber
                if sub is not None:
                    if Defect.NO_RETRY_FIELD not in self.defects:  # defect: close without advising `retry`
                        sub.push(advice, counts=False)
                    sub.end("server_stopping")

    def close(self) -> None:
        """Close streams (reason shutdown) and flush the ledger; with a store, pause them
        instead and flush and close the store (durable.py)."""
        for t in list(self._tasks):
            t.cancel()
        self.state.shutdown(time.time())
        self.ledger.close()

    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.state.sweep(time.time())

    async def _heartbeat(self) -> None:
        period = self.config.heartbeat_ms / 1000.0
        n = 0
        while True:
            await asyncio.sleep(period)
            now = time.time()
            for s in list(self.state.sessions.values()):
                g = s.standalone
                if g is not None and g.subscriber is not None:
                    n += 1
                    self.state.log_message(s, "info", "mcp-lab/heartbeat", {"heartbeat": n}, now)

    def _log(self, req: Request, status: int, reason: str | None, cursor_verdict: str | None = None) -> None:
        log_request(self.ledger, req, status, reason, cursor_verdict)

    def log_request(self, req: Request, status: int, reason: str | None) -> None:
        """The request in the ledger (lab.server.modern's answers)."""
        self._log(req, status, reason)

    def retry_after(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.config.retry_after).encode())]

    _retry_after = retry_after

    # ------------------------------------------------------------------ the MCP endpoint

    async def _mcp(self, req: Request, receive: Receive, send: Send) -> None:
        cfg = self.config
        host = req.header("host")
        if host is None or not matches(host, cfg.allowed_hosts):
            raise Refused(421, "bad_host", "Host not allowed")
        origin = req.header("origin")
        if origin is not None:
            req.origin_allowed = matches(origin, cfg.allowed_origins)
            if not req.origin_allowed and Defect.ANY_ORIGIN not in self.defects:  # defect: serve any Origin
                raise Refused(403, "bad_origin", "Origin not allowed")
        version = req.header(PROTOCOL_VERSION_HEADER)
        # The era of the request (docs/eras.md): a modern revision in the header, where the
        # server serves one; else the handshake era's rules below.
        modern_era = version in modern.served(self)
        handshake = tuple(v for v in cfg.protocol_versions if v in SUPPORTED_REVISIONS)
        if modern_era or not handshake:
            allow = (b"allow", b"POST")
        elif req.method not in ("POST", "GET", "DELETE"):
            raise Refused(
                405, "method_not_allowed", "use GET, POST or DELETE", [(b"allow", b"GET, POST, DELETE")]
            )
        subject = self._authenticate(req)
        now = time.time()
        if not self.rate.try_acquire(now):
            raise Refused(429, "rate_limited", "too many requests", self._retry_after())
        if modern_era:
            await modern.handle(self, req, receive, send, subject)
            return
        if not handshake:
            # A server of the modern era only: the handshake era's requests are refused,
            # naming what it serves (a client may then speak 2026-07-28).
            if req.method != "POST":
                raise Refused(405, "method_not_allowed", "this server serves 2026-07-28 only: POST", [allow])
            raise self._unsupported(version, f"this server serves {', '.join(cfg.protocol_versions)} only")
        if version is not None and version not in cfg.protocol_versions:
            raise self._unsupported(version, f"unsupported MCP-Protocol-Version {version!r}")
        if req.method == "POST":
            await self._post(req, receive, send, subject, now)
        elif req.method == "GET":
            await self._get(req, receive, send, subject, now)
        else:
            await self._delete(req, send, subject, now)

    def _unsupported(self, version: str | None, message: str) -> Refused:
        """Either era's answer to a revision it does not serve: 400, and (2026-07-28's
        UnsupportedProtocolVersion) what it serves, so that a client of either era can
        choose."""
        served = list(self.config.protocol_versions)
        data = {"supported": served, "requested": version}
        return Refused(400, "bad_version", message, code=UNSUPPORTED_VERSION, data=data)

    def _authenticate(self, req: Request) -> str | None:
        if not self.config.tokens:
            return None
        auth = req.header("authorization") or ""
        scheme, _, token = auth.partition(" ")
        subject = self.config.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if subject is None:
            raise Refused(
                401, "bad_token", "a valid bearer token is required", [(b"www-authenticate", b"Bearer")]
            )
        return subject

    def _session(self, req: Request, subject: str | None, now: float) -> Session:
        sid = req.header(SESSION_HEADER)
        if sid is None:
            fallback = (
                self.state.latest_session(subject)
                if Defect.SERVE_WITHOUT_SESSION in self.defects  # defect: serve a request naming no session
                else None
            )
            if fallback is None:
                raise Refused(400, "missing_session", "MCP-Session-Id header required")
            sid = fallback.sid
        s = self.state.sessions.get(sid)
        if s is None or not s.alive:
            if Defect.UNKNOWN_SESSION_400 in self.defects:  # defect: 400 where the rule says 404
                raise Refused(400, "unknown_session", "session not found")
            raise Refused(404, "unknown_session", "session not found")
        req.session = s
        if s.subject != subject:
            raise Refused(403, "subject_mismatch", "the token's subject is not this session's")
        version = req.header(PROTOCOL_VERSION_HEADER)
        if version is not None and version != s.version:
            raise Refused(400, "version_mismatch", f"negotiated {s.version}, got {version}")
        self.state.touch(s, now)
        return s

    async def _post(
        self, req: Request, receive: Receive, send: Send, subject: str | None, now: float
    ) -> None:
        raw, body = await read_json_post(req, receive, self.config.max_body)
        if isinstance(body, list):
            await self._batch(req, send, body, subject, now)
            return
        try:
            msg = jsonrpc.classify(body)
        except RemoteProtocolError as e:
            raise Refused(400, "invalid_message", str(e)) from None
        if msg.method == jsonrpc.INITIALIZE:
            await self._initialize(req, send, msg, subject, now)
            return
        s = self._session(req, subject, now)
        if msg.kind is not jsonrpc.MessageKind.REQUEST:
            if msg.method == jsonrpc.CANCELLED:
                self._cancel(s, msg, now)
            self._log(req, 202, None)
            await send_empty(send, 202)
            return
        if Defect.STALLS_AT_CAPACITY in self.defects and len(self.state.sessions) > STALL_SESSIONS:
            await until_disconnect(receive)  # defect: past its capacity, a request is never answered
            return
        mid = msg.id
        assert mid is not None
        if mid in s.request_ids:
            raise Refused(400, "request_id_reused", "request ID already used in this session")
        if self.open_sse >= self.config.max_streams:
            raise Refused(503, "overloaded", "too many concurrent streams", self._retry_after())
        digest = hashlib.sha256(raw).hexdigest()
        st = self._open(lambda: self.state.open_post_stream(s, mid, digest, req.conn, now))
        s.request_ids.add(mid)
        if self.config.json_answers and msg.method == "tools/call" and msg.params.get("name") != "ticker":
            # JSON answers (legal): the call runs to its end, its answer is the body; the
            # stream is kept for the server's own bookkeeping and ends with the answer.
            answer = await self._run_request(st, msg)
            if answer is None:  # cancelled meanwhile (notifications/cancelled): no answer is due
                self._log(req, 202, None)
                await send_empty(send, 202)
                return
            self._log(req, 200, None)
            await send_json_text(send, 200, answer)
            return
        st.task = self._spawn(self._run_request(st, msg))
        self._log(req, 200, None)
        await self._stream(req, receive, send, st, None)

    def _open(self, opener: Callable[[], Stream]) -> Stream:
        try:
            stream = opener()
        except Full:
            raise Refused(
                429, "too_many_streams", "this session has too many open streams", self._retry_after()
            ) from None
        return stream

    async def _batch(
        self, req: Request, send: Send, body: list[Any], subject: str | None, now: float
    ) -> None:
        sid = req.header(SESSION_HEADER)
        s = self.state.sessions.get(sid) if sid is not None else None
        version = req.header(PROTOCOL_VERSION_HEADER) or (s.version if s is not None else "2025-03-26")
        if not body or not revision(version).batching:
            raise Refused(400, "batch_not_allowed", f"JSON-RPC batches are not allowed in {version}")
        s = self._session(req, subject, now)
        try:
            msgs = [jsonrpc.classify(m) for m in body]
        except RemoteProtocolError as e:
            raise Refused(400, "invalid_message", str(e)) from None
        if any(m.method == jsonrpc.INITIALIZE for m in msgs):
            raise Refused(400, "invalid_message", "initialize cannot be batched")
        out = [self._answer_inline(m) for m in msgs if m.kind is jsonrpc.MessageKind.REQUEST]
        self._log(req, 200 if out else 202, None)
        if out:
            await send_json(send, 200, out)
        else:
            await send_empty(send, 202)

    @staticmethod
    def _answer_inline(m: jsonrpc.Message) -> jsonrpc.JsonObject:
        """A request of a 2025-03-26 batch: answered in the JSON array, not streamed."""
        assert m.id is not None
        if m.method == "tools/list":
            return jsonrpc.result(m.id, {"tools": TOOL_LIST})
        if m.method == "ping":
            return jsonrpc.result(m.id, {})
        return jsonrpc.error(m.id, jsonrpc.METHOD_NOT_FOUND, f"{m.method} cannot be batched here")

    async def _initialize(
        self, req: Request, send: Send, msg: jsonrpc.Message, subject: str | None, now: float
    ) -> None:
        if req.header(SESSION_HEADER) is not None:
            raise Refused(400, "initialize_with_session", "initialize must not carry a session ID")
        if msg.kind is not jsonrpc.MessageKind.REQUEST or msg.id is None:
            raise Refused(400, "invalid_message", "initialize must be a request")
        requested = msg.params.get("protocolVersion")
        handshake = tuple(v for v in self.config.protocol_versions if v in SUPPORTED_REVISIONS)
        version = negotiate(requested if isinstance(requested, str) else "", handshake)
        result = {"protocolVersion": version, "capabilities": self.capabilities(), "serverInfo": SERVER_INFO}
        body = jsonrpc.dumps(jsonrpc.result(msg.id, result))
        try:
            s = self.state.create_session(subject, version, body, now)
        except Full:
            raise Refused(
                503, "too_many_sessions", "too many sessions, all busy", self._retry_after()
            ) from None
        req.session = s
        self._log(req, 200, None)
        await send_json_text(send, 200, body, [(SESSION_HEADER.encode(), s.sid.encode())])

    def _cancel(self, s: Session, msg: jsonrpc.Message, now: float) -> None:
        rid = msg.params.get("requestId")
        for st in s.streams.values():
            if st.request_id == rid and not st.complete:
                if st.task is not None and not st.task.done():
                    st.task.cancel()
                self.state.close_stream(st, "cancelled", now)

    async def _run_request(self, st: Stream, msg: jsonrpc.Message) -> str | None:
        """Run the request, then send its answer on its stream; the answer (None if the
        call was cancelled, or its stream closed meanwhile)."""
        assert msg.id is not None
        rid = str(msg.id)
        try:
            result = await dispatch(self.state, st, msg)
            data, kind = jsonrpc.dumps(jsonrpc.result(msg.id, result)), "response"
        except ToolError as e:
            data, kind = jsonrpc.dumps(jsonrpc.error(msg.id, e.code, e.message)), "error"
        except asyncio.CancelledError:
            return None
        except Exception:
            log.exception("tool failed")
            data, kind = (
                jsonrpc.dumps(jsonrpc.error(msg.id, jsonrpc.INTERNAL_ERROR, "internal error")),
                "error",
            )
        if st.closed_at is None:
            now = time.time()
            g = st.session.standalone
            if Defect.RESPONSE_ON_GET in self.defects and g is not None and g.closed_at is None:
                # defect: the response on the standalone GET too (a kind of its own in the
                # ledger, so that it neither ends that stream nor passes for the real answer)
                self.state.emit(g, data, "stray_response", rid, now)
            self.state.emit(st, data, kind, rid, now)
            return data
        return None

    async def _get(self, req: Request, receive: Receive, send: Send, subject: str | None, now: float) -> None:
        if "text/event-stream" not in (req.header("accept") or "").lower():
            raise Refused(406, "bad_accept", "Accept must list text/event-stream")
        s = self._session(req, subject, now)
        if self.open_sse >= self.config.max_streams:
            raise Refused(503, "overloaded", "too many concurrent streams", self._retry_after())
        cursor = req.header(LAST_EVENT_ID_HEADER)
        if cursor is None:
            st = self._open(lambda: self.state.open_standalone(s, req.conn, now))
            self._log(req, 200, None)
            await self._stream(req, receive, send, st, None)
            return
        found = self.state.resolve_cursor(s, cursor)
        if isinstance(found, Resumption):
            self._log(req, 200, None, "valid")
            if Defect.RESUME_EMPTY in self.defects:  # defect: a fresh priming event, a close, no replay
                await self._empty_resumption(send, found.stream)
                return
            hold = SLOW_RESUME_S if Defect.SLOW_RESUME in self.defects else 0.0  # defect: replay late
            await self._stream(req, receive, send, found.stream, found, hold_s=hold)
            return
        verdict = found
        if Defect.UNKNOWN_CURSOR_SILENT in self.defects:  # defect: 200 and a stream that carries nothing
            self._log(req, 200, None, verdict)
            await self._silent_stream(receive, send)
            return
        if self.config.cursor_policy == "fresh":
            st = self._open(lambda: self.state.open_standalone(s, req.conn, now))
            self._log(req, 200, None, verdict)
            await self._stream(req, receive, send, st, None)
            return
        status = self.config.cursor_reject_status
        self._log(req, status, "cursor_rejected", verdict)
        await send_json(
            send, status, jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"Last-Event-ID rejected: {verdict}")
        )

    async def _delete(self, req: Request, send: Send, subject: str | None, now: float) -> None:
        s = self._session(req, subject, now)
        if self.config.refuse_delete:
            raise Refused(
                405,
                "delete_refused",
                "this server does not let clients terminate sessions",
                [(b"allow", b"GET, POST")],
            )
        if Defect.DELETED_SESSION_ALIVE not in self.defects:  # defect: answer 200, keep the session
            self.state.end_session(s, "deleted", now)
        self._log(req, 200, None)
        await send_empty(send, 200)

    async def _stream(
        self,
        req: Request,
        receive: Receive,
        send: Send,
        st: Stream,
        resumed: Resumption | None,
        *,
        hold_s: float = 0.0,
    ) -> None:
        """Stream `st` on this response: the resumption's backlog first, then live (after
        `hold_s` with only the head sent: the defect slow-resume)."""
        live = LiveConn(req.conn, self.config.max_session_event_bytes)
        self.open_sse += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            if hold_s > 0:
                await asyncio.sleep(hold_s)
            self.state.attach(st, live, None if resumed is None else resumed.backlog, time.time())
            try:
                await serve_live(receive, send, live, self.config.keepalive_s)
            finally:
                self.state.detach(st, live, live.end_reason or "client_gone", time.time())
        except OSError:
            live.end("client_gone")
            self.state.detach(st, live, "client_gone", time.time())
        finally:
            self.open_sse -= 1

    async def _empty_resumption(self, send: Send, st: Stream) -> None:
        """defect resume-empty: 200, a priming event with a fresh ID of the stream (stored,
        as a server that takes every resumption for a new stream would), and the end."""
        ev = self.state.emit(st, "", "priming", None, time.time())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": ev.wire, "more_body": False})
        except OSError:
            pass

    async def _silent_stream(self, receive: Receive, send: Send) -> None:
        """defect unknown-cursor-silent: an SSE stream with keep-alives and nothing else."""
        self.open_sse += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await serve_live(receive, send, LiveConn(None, 1), self.config.keepalive_s)
        except OSError:
            pass
        finally:
            self.open_sse -= 1
