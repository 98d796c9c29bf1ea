"""An in-memory model of an MCP server, and a fake link that drives a ClientCore with it.

Deliberately small and independent of the reference server: it answers the core's
requests by the protocol's rules (sessions, 400/404, streams, event IDs from the codec,
replay of one stream only, idempotent writes) and records its ground truth: which message
digest was produced on which stream of which session, how many business side effects each
idempotency key caused, and every write it handled (`dispatches`, the server ledger's rows).

The `Link` plays the network: it carries out the core's commands, holds each response's
remaining chunks, and can deliver them one by one, cut a connection, close it the polling
way (with `retry`), replay an event already delivered, or inject an event of another
stream or another session. Like the lab's proxy, it keeps a tap of everything that passed
(`ModelTap`, tests/client/model_ledgers.py), so the checker's gates can judge a model run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass, field

from lab.client import ClientCore, Notice, Output
from lab.client._commands import CloseConnection, Command, Purpose, SendRequest
from lab.wire import jsonrpc
from lab.wire.client_ledger import Record
from lab.wire.event_ids import (
    CursorVerdict,
    EventIdCodec,
    message_digest,
    parse_event_id,
    post_stream_id,
    session_tag,
)
from lab.wire.extensions import EVENT_ID_CAPABILITY, IDEMPOTENCY_META
from lab.wire.revisions import LAST_EVENT_ID_HEADER
from lab.wire.sse import encode_event
from tests.client.model_ledgers import INJECT, LOST_ANSWER, REPLAY, ModelTap, TapFlow

SSE = (("content-type", "text/event-stream"),)
JSON = (("content-type", "application/json"),)


@dataclass
class ModelStream:
    stream_id: str
    request_id: object | None
    events: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = False


@dataclass
class ModelSession:
    sid: str
    tag: str
    subject: str | None
    version: str
    alive: bool = True
    streams: dict[str, ModelStream] = field(default_factory=dict)
    request_ids: set[object] = field(default_factory=set)
    gets: int = 0


@dataclass(frozen=True, slots=True)
class ModelDispatch:
    """A write call the model server handled: its side effect happened once per key."""

    session_id: str
    subject: str | None
    idempotency_key: str
    tool: str
    request_id: object
    effect: str
    """performed | replayed (the stored receipt was returned, no new effect)."""
    receipt: int
    arguments_digest: str
    at: float


@dataclass
class Reply:
    status: int
    headers: tuple[tuple[str, str], ...]
    chunks: list[bytes]
    hold_open: bool = False
    stream: tuple[str, str] | None = None
    """(session ID, stream ID) of a live stream this connection carries."""


class ModelServer:
    def __init__(self, *, progress_events: int = 2, seed: int = 0, announce_ids: bool = True) -> None:
        self.codec = EventIdCodec(b"model-server-key" * 2)
        self.sessions: dict[str, ModelSession] = {}
        self.effects: Counter[tuple[str | None, str]] = Counter()
        self.receipts: dict[tuple[str | None, str], dict[str, int]] = {}
        self.sent: set[tuple[str, str, str]] = set()
        """(session ID, stream ID, message digest) of every message sent: the truth."""
        self.progress_events = progress_events
        self.refuse_next: list[tuple[int, str | None]] = []
        """Queued (status, Retry-After) answers for the next requests (429/503 storms)."""
        self.delete_status = 200
        self.announce_ids = announce_ids
        """Announce `e1` event IDs at initialize; else the client takes them as opaque."""
        self.silent_resumes = 0
        """The next resumptions are answered 200 with a stream that never carries anything."""
        self.stalled_calls = 0
        """The next calls send their priming event, then hold the stream open and send
        nothing more (the rest is produced, and replayed to a resumption)."""
        self.rng = random.Random(seed)
        self._ids = itertools.count(1)
        self.now = 0.0
        """Model time of the request being handled (set by the Link)."""
        self.dispatches: list[ModelDispatch] = []
        """Every write call handled (a call with an idempotency key), in order."""
        self.tools: list[dict[str, object]] = [
            {"name": "echo", "annotations": {"readOnlyHint": True}},
            {
                "name": "ledger.append",
                "annotations": {"idempotentHint": False},
                "_meta": {IDEMPOTENCY_META: True},
            },
            {"name": "bare"},
        ]
        """What `tools/list` answers: echo read-only, ledger.append with its key honoured,
        bare with neither (the retry rule's three cases)."""

    # -- helpers -----------------------------------------------------------------------

    def _emit(self, s: ModelSession, st: ModelStream, data: str) -> bytes:
        eid = self.codec.mint(s.tag, 0, st.stream_id, len(st.events), data)
        st.events.append((eid, data))
        if data:
            self.sent.add((s.sid, st.stream_id, message_digest(data)))
        return encode_event(data, id=eid)

    def push_notification(self, sid: str) -> list[tuple[str, bytes]]:
        """A server notification on every standalone stream of session `sid`."""
        s = self.sessions[sid]
        out = []
        for st in s.streams.values():
            if st.request_id is None:
                note = jsonrpc.dumps(jsonrpc.notification("notifications/message", {"data": next(self._ids)}))
                out.append((st.stream_id, self._emit(s, st, note)))
        return out

    def expire(self, sid: str) -> None:
        self.sessions[sid].alive = False

    # -- requests ----------------------------------------------------------------------

    def handle(self, req: SendRequest) -> Reply:
        if self.refuse_next:
            status, retry_after = self.refuse_next.pop(0)
            headers = () if retry_after is None else (("retry-after", retry_after),)
            return Reply(status, headers, [])
        sid = req.header("mcp-session-id")
        auth = req.header("authorization")
        subject = None if auth is None else auth.removeprefix("Bearer ")
        if req.method == "POST" and req.body is not None:
            msg = jsonrpc.parse_message(req.body)
            if msg.method == jsonrpc.INITIALIZE:
                return self._initialize(msg, subject)
        if sid is None:
            return Reply(400, JSON, [])
        s = self.sessions.get(sid)
        if s is None or not s.alive:
            return Reply(404, JSON, [])
        if s.subject != subject:
            return Reply(403, JSON, [])
        if req.method == "DELETE":
            if self.delete_status in (200, 204):
                s.alive = False
            return Reply(self.delete_status, (), [])
        if req.method == "GET":
            last = req.header("last-event-id")
            return self._resume(s, last) if last is not None else self._standalone(s)
        assert req.body is not None
        msg = jsonrpc.parse_message(req.body)
        if msg.kind is jsonrpc.MessageKind.NOTIFICATION:
            return Reply(202, (), [])
        if msg.method == "tools/list":
            body = jsonrpc.dumps(jsonrpc.result(msg.id or 0, {"tools": self.tools})).encode()
            return Reply(200, JSON, [body])
        return self._call(s, msg)

    def _initialize(self, msg: jsonrpc.Message, subject: str | None) -> Reply:
        sid = f"model-session-{next(self._ids)}-{self.rng.getrandbits(64):016x}"
        version = str(msg.params.get("protocolVersion"))
        self.sessions[sid] = ModelSession(sid, session_tag(sid), subject, version)
        caps = {"experimental": {EVENT_ID_CAPABILITY: {"scheme": "e1"}}} if self.announce_ids else {}
        result = {
            "protocolVersion": version,
            "capabilities": caps,
            "serverInfo": {"name": "model", "version": "0"},
        }
        body = jsonrpc.dumps(jsonrpc.result(msg.id or 0, result)).encode()
        return Reply(200, (*JSON, ("mcp-session-id", sid)), [body])

    def _call(self, s: ModelSession, msg: jsonrpc.Message) -> Reply:
        if msg.id in s.request_ids:
            return Reply(400, JSON, [])  # request IDs must not be reused within a session
        s.request_ids.add(msg.id)
        assert msg.id is not None
        st = ModelStream(post_stream_id(s.tag, msg.id), msg.id)
        s.streams[st.stream_id] = st
        meta = msg.params.get("_meta", {})
        key = meta.get(IDEMPOTENCY_META)
        token = meta.get("progressToken")
        chunks = [self._emit(s, st, "")]
        for n in range(self.progress_events):
            note = jsonrpc.notification(jsonrpc.PROGRESS, {"progressToken": token, "progress": n + 1})
            chunks.append(self._emit(s, st, jsonrpc.dumps(note)))
        # The business side effect happens here, before the response is sent: exactly the
        # moment the lab's founding failure story cuts the connection.
        ikey = (s.subject, str(key))
        performed = ikey not in self.receipts
        if performed:
            self.effects[ikey] += 1
            self.receipts[ikey] = {"receipt": len(self.receipts) + 1}
        if key is not None:
            self._dispatched(s, msg, str(key), performed)
        resp = jsonrpc.result(
            msg.id, {"content": [{"type": "text", "text": json.dumps(self.receipts[ikey])}]}
        )
        chunks.append(self._emit(s, st, jsonrpc.dumps(resp)))
        st.complete = True
        if self.stalled_calls:
            self.stalled_calls -= 1
            return Reply(200, SSE, chunks[:1], hold_open=True)
        return Reply(200, SSE, chunks)

    def _dispatched(self, s: ModelSession, msg: jsonrpc.Message, key: str, performed: bool) -> None:
        tool = str(msg.params.get("name"))
        canonical = json.dumps(
            {"tool": tool, "arguments": msg.params.get("arguments")}, sort_keys=True, separators=(",", ":")
        )
        self.dispatches.append(
            ModelDispatch(
                s.sid,
                s.subject,
                key,
                tool,
                msg.id,
                "performed" if performed else "replayed",
                self.receipts[(s.subject, key)]["receipt"],
                hashlib.sha256(canonical.encode()).hexdigest(),
                self.now,
            )
        )

    def _standalone(self, s: ModelSession) -> Reply:
        s.gets += 1
        st = ModelStream(f"g{s.gets}", None)
        s.streams[st.stream_id] = st
        return Reply(200, SSE, [self._emit(s, st, "")], hold_open=True, stream=(s.sid, st.stream_id))

    def _resume(self, s: ModelSession, last: str) -> Reply:
        verdict, parsed = self.codec.classify(last, session_tag=s.tag, generations=(0,))
        if verdict is not CursorVerdict.VALID or parsed is None or parsed.stream_id not in s.streams:
            return Reply(400, JSON, [])
        st = s.streams[parsed.stream_id]
        if self.silent_resumes:
            self.silent_resumes -= 1
            return Reply(200, SSE, [], hold_open=True)
        chunks = [encode_event(d, id=e) for e, d in st.events[parsed.sequence + 1 :]]
        live = st.request_id is None
        return Reply(200, SSE, chunks, hold_open=live, stream=(s.sid, st.stream_id) if live else None)


@dataclass
class OpenConn:
    conn_id: int
    req: SendRequest
    chunks: list[bytes]
    hold_open: bool
    stream: tuple[str, str] | None
    flow: TapFlow
    delivered: list[bytes] = field(default_factory=list)


ANSWER_DELAY = 1e-6
"""Seconds from a request leaving to its answer arriving (a few ulps at epoch ~1.8e9)."""


class Link:
    """Carries a ClientCore's commands to a ModelServer, and faults in between."""

    def __init__(self, core: ClientCore, server: ModelServer, tap: ModelTap | None = None) -> None:
        self.core = core
        self.server = server
        self.tap = tap if tap is not None else ModelTap(core.redactor)
        """What passed, as the proxy's tap records it (one tap may serve several links)."""
        self.now = 1_800_000_000.0
        self.open: dict[int, OpenConn] = {}
        self.requests: list[SendRequest] = []
        self.lose_next_response: set[Purpose] = set()
        """Purposes whose next response is lost after the server handled the request."""
        self.defer_head: set[Purpose] = set()
        """Purposes whose answers wait (the request is in flight) until `deliver_head`."""
        self.deferred: dict[int, tuple[SendRequest, Reply, TapFlow]] = {}
        self.records: list[Record] = []
        """Every ledger record the core produced, in order (what a driver would write)."""
        self.notices: list[Notice] = []
        """Every notice the core produced, in order (what the application would read)."""

    def take(self, out: Output) -> list[Command]:
        """Keep an output's records and notices; its commands are to be carried out."""
        self.records += out.records
        self.notices += out.notices
        return list(out.commands)

    def run(self, out: Output) -> None:
        """Carry out an output's commands in order; what a command's answer causes runs first
        (depth first), and closing a connection that was not sent yet cancels its request."""
        queue = self.take(out)
        cancelled: set[int] = set()
        while queue:
            cmd = queue.pop(0)
            if isinstance(cmd, CloseConnection):
                gone = self.open.pop(cmd.conn_id, None)
                if gone is not None:
                    self.tap.end(gone.flow, self.now, "client_gone")
                cancelled.add(cmd.conn_id)
                continue
            if cmd.conn_id in cancelled:
                continue
            self.requests.append(cmd)
            flow = self.tap.request(cmd.method, cmd.headers, cmd.body)
            self.server.now = self.now
            reply = self.server.handle(cmd)
            # An answer is never back at the very instant its request left (as on any real
            # network): without this, a request the core issued in the same step as the one
            # that gets a 404 would look as if it had been sent in reaction to that 404.
            self.now += ANSWER_DELAY
            if cmd.purpose in self.defer_head:
                self.deferred[cmd.conn_id] = (cmd, reply, flow)
                continue
            if cmd.purpose in self.lose_next_response:
                self.lose_next_response.discard(cmd.purpose)
                self.tap.head(flow, self.now, None, faults=[LOST_ANSWER])  # no head reached the client
                self.tap.end(flow, self.now, "cut_by_fault")
                queue[:0] = self.take(self.core.connection_failed(cmd.conn_id, self.now))
                continue
            queue[:0] = self._head(cmd, reply, reply.status, flow)

    def _head(self, cmd: SendRequest, reply: Reply, status: int, flow: TapFlow) -> list[Command]:
        """The answer's head reaches the client: what it causes, to be carried out."""
        conn = OpenConn(
            cmd.conn_id, cmd, list(reply.chunks) if status == 200 else [], reply.hold_open, reply.stream, flow
        )
        self.open[cmd.conn_id] = conn
        self.tap.head(flow, self.now, status, reply.headers)
        for chunk in conn.chunks:
            self.tap.produced(flow, chunk)
        caused = self.take(self.core.response_head(cmd.conn_id, status, list(reply.headers), self.now))
        if cmd.conn_id in self.open and status != 200:
            self.open.pop(cmd.conn_id, None)
            self.tap.end(flow, self.now, "complete")
            caused += self.take(self.core.response_end(cmd.conn_id, self.now))
        return caused

    def deliver_head(self, conn_id: int, status: int | None = None) -> None:
        """Let a deferred answer arrive now (optionally with another status)."""
        cmd, reply, flow = self.deferred.pop(conn_id)
        head = reply.status if status is None else status
        self.run(Output(tuple(self._head(cmd, reply, head, flow))))

    # -- delivery ----------------------------------------------------------------------

    def deliver(self, conn_id: int, n: int = 1) -> None:
        conn = self.open.get(conn_id)
        if conn is None:
            return
        for _ in range(n):
            if conn.chunks:
                chunk = conn.chunks.pop(0)
                conn.delivered.append(chunk)
                self.tap.passed(conn.flow, chunk, self.now)
                self.run(self.core.response_data(conn_id, chunk, self.now))
                if conn_id not in self.open:
                    return
            elif not conn.hold_open:
                self.open.pop(conn_id, None)
                self.tap.end(conn.flow, self.now, "complete")
                self.run(self.core.response_end(conn_id, self.now))
                return

    def push(self, sid: str) -> None:
        """A server notification, delivered live to whichever connection carries that stream."""
        for stream_id, chunk in self.server.push_notification(sid):
            for conn in self.open.values():
                if conn.stream == (sid, stream_id):
                    conn.chunks.append(chunk)
                    self.tap.produced(conn.flow, chunk)

    def settle(self, max_steps: int = 10_000, *, patience: float | None = None) -> None:
        """Deliver everything, and run timers, until nothing is left to do (or nothing
        will happen within `patience` seconds of model time)."""
        settle_together([self], max_steps, patience=patience)

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)
        self.run(self.core.tick(self.now))

    # -- faults ------------------------------------------------------------------------

    def cut(self, conn_id: int) -> None:
        conn = self.open.pop(conn_id, None)
        if conn is not None:
            self.tap.cut(conn.flow, self.now)
            self.run(self.core.connection_failed(conn_id, self.now))

    def polling_close(self, conn_id: int, retry_ms: int) -> None:
        """The server ends the stream the polling way: a `retry` event, then the end (what
        the Link still held for it is not sent; a resumption replays it)."""
        conn = self.open.pop(conn_id, None)
        if conn is not None:
            chunk = encode_event(None, retry=retry_ms)
            self.tap.forget_pending(conn.flow)
            self.tap.produced(conn.flow, chunk)
            self.tap.passed(conn.flow, chunk, self.now)
            self.run(self.core.response_data(conn_id, chunk, self.now))
            self.tap.end(conn.flow, self.now, "complete")
            self.run(self.core.response_end(conn_id, self.now))

    def replay_delivered(self, conn_id: int, which: int | None = None) -> None:
        """Deliver again an event this connection already delivered (`which`: its position
        among the delivered ones; None: one at random)."""
        conn = self.open.get(conn_id)
        if conn is not None and conn.delivered:
            chunk = self.server.rng.choice(conn.delivered) if which is None else conn.delivered[which]
            conn.chunks.insert(0, chunk)
            self.tap.faulted(conn.flow, chunk, REPLAY)

    def inject(self, conn_id: int, chunk: bytes) -> None:
        conn = self.open.get(conn_id)
        if conn is not None:
            conn.chunks.insert(0, chunk)
            self.tap.faulted(conn.flow, chunk, INJECT)

    def stream_of(self, conn_id: int) -> str | None:
        """The server stream a connection carries (POST streams: derived from the request ID)."""
        conn = self.open.get(conn_id)
        if conn is None:
            return None
        if conn.stream is not None:
            return conn.stream[1]
        sid = conn.req.header("mcp-session-id")
        if conn.req.purpose is Purpose.CALL and conn.req.body is not None and sid in self.server.sessions:
            rid = json.loads(conn.req.body)["id"]
            return post_stream_id(self.server.sessions[sid].tag, rid)
        cursor = conn.req.header(LAST_EVENT_ID_HEADER)
        parsed = None if cursor is None else parse_event_id(cursor)
        return None if parsed is None else parsed.stream_id  # a resumption carries its stream

    def foreign_chunk(self, sid: str, *, same_session: bool, not_stream: str | None = None) -> bytes | None:
        """An event (with its genuine ID) of another stream of `sid`, or of another session,
        among those the server sent (a proxy can only inject what passed it)."""
        session = self.tap.redactor.session(sid)
        pool = [
            ev.chunk
            for ev in self.tap.sent_events()
            if ev.has_message and (ev.session == session) == same_session and ev.stream_id != not_stream
        ]
        if not pool:
            return None
        return self.server.rng.choice(pool)

    def conns(self, purpose: Purpose | None = None) -> list[int]:
        return sorted(c for c, o in self.open.items() if purpose is None or o.req.purpose is purpose)


def settle_together(links: list[Link], max_steps: int = 10_000, *, patience: float | None = None) -> None:
    """`Link.settle` for the clients of one process: one clock for all of them (their
    shared reconnect budget counts attempts per second of that clock), moved to the
    earliest timer of any client."""
    now = max(link.now for link in links)
    for link in links:
        link.advance_to(now)
    for _ in range(max_steps):
        busy = [(link, c) for link in links for c in link.open.values() if c.chunks or not c.hold_open]
        if busy:
            link, conn = busy[0]
            link.deliver(conn.conn_id)
            continue
        wakes = [w for link in links if (w := link.core.next_wakeup()) is not None]
        if not wakes or (patience is not None and min(wakes) - now > patience):
            return
        now = max(now, min(wakes))
        for link in links:
            link.advance_to(now)
    raise AssertionError("links did not settle")
