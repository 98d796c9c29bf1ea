"""An in-memory model of an MCP server, and a fake link that drives a ClientCore with it.

Deliberately small and independent of the reference server: it answers the core's
requests by the protocol's rules (sessions, 400/404, streams, event IDs from the codec,
replay of one stream only, idempotent writes) and records the ground truth the
invariants are checked against: which message digest was sent on which stream of which
session, and how many business side effects each idempotency key caused.

The `Link` plays the network: it carries out the core's commands, holds each response's
remaining chunks, and can deliver them one by one, cut a connection, close it the polling
way (with `retry`), replay an event already delivered, or inject an event of another
stream or another session.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass, field

from lab.client import ClientCore, Notice, Output
from lab.client._commands import CloseConnection, Command, Purpose, SendRequest
from lab.wire import jsonrpc
from lab.wire.client_ledger import Record
from lab.wire.event_ids import CursorVerdict, EventIdCodec, message_digest, post_stream_id, session_tag
from lab.wire.extensions import EVENT_ID_CAPABILITY, IDEMPOTENCY_META
from lab.wire.sse import encode_event

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
        self.receipts: dict[tuple[str | None, str], dict[str, object]] = {}
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
        if ikey not in self.receipts:
            self.effects[ikey] += 1
            self.receipts[ikey] = {"receipt": len(self.receipts) + 1}
        resp = jsonrpc.result(
            msg.id, {"content": [{"type": "text", "text": json.dumps(self.receipts[ikey])}]}
        )
        chunks.append(self._emit(s, st, jsonrpc.dumps(resp)))
        st.complete = True
        if self.stalled_calls:
            self.stalled_calls -= 1
            return Reply(200, SSE, chunks[:1], hold_open=True)
        return Reply(200, SSE, chunks)

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
    delivered: list[bytes] = field(default_factory=list)


class Link:
    """Carries a ClientCore's commands to a ModelServer, and faults in between."""

    def __init__(self, core: ClientCore, server: ModelServer) -> None:
        self.core = core
        self.server = server
        self.now = 1_800_000_000.0
        self.open: dict[int, OpenConn] = {}
        self.requests: list[SendRequest] = []
        self.after_404: list[bool] = []
        """For every request: was the previous answer to this client a 404 on a session request?"""
        self._expect_init = False
        self.standalone: dict[str, tuple[str, str]] = {}
        """Client stream key of each standalone GET stream -> (session ID, server stream ID)."""
        self.lose_next_response: set[Purpose] = set()
        """Purposes whose next response is lost after the server handled the request."""
        self.defer_head: set[Purpose] = set()
        """Purposes whose answers wait (the request is in flight) until `deliver_head`."""
        self.deferred: dict[int, tuple[SendRequest, Reply]] = {}
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
                self.open.pop(cmd.conn_id, None)
                cancelled.add(cmd.conn_id)
                continue
            if cmd.conn_id in cancelled:
                continue
            self.requests.append(cmd)
            self.after_404.append(self._expect_init)
            self._expect_init = False
            reply = self.server.handle(cmd)
            if cmd.purpose in self.defer_head:
                self.deferred[cmd.conn_id] = (cmd, reply)
                continue
            if cmd.purpose in self.lose_next_response:
                self.lose_next_response.discard(cmd.purpose)
                queue[:0] = self.take(self.core.connection_failed(cmd.conn_id, self.now))
                continue
            if reply.status == 404 and cmd.header("mcp-session-id") is not None:
                self._expect_init = True
            self.open[cmd.conn_id] = OpenConn(
                cmd.conn_id, cmd, list(reply.chunks), reply.hold_open, reply.stream
            )
            key = self.core.stream_key_of(cmd.conn_id)
            if cmd.purpose is Purpose.STANDALONE and reply.stream is not None and key is not None:
                self.standalone[key] = reply.stream
            caused = self.take(
                self.core.response_head(cmd.conn_id, reply.status, list(reply.headers), self.now)
            )
            if cmd.conn_id in self.open and reply.status != 200:
                self.open.pop(cmd.conn_id, None)
                caused += self.take(self.core.response_end(cmd.conn_id, self.now))
            queue[:0] = caused

    def deliver_head(self, conn_id: int, status: int | None = None) -> None:
        """Let a deferred answer arrive now (optionally with another status)."""
        cmd, reply = self.deferred.pop(conn_id)
        head = reply.status if status is None else status
        self.open[conn_id] = OpenConn(
            conn_id, cmd, list(reply.chunks) if head == 200 else [], reply.hold_open, reply.stream
        )
        caused = self.take(self.core.response_head(conn_id, head, list(reply.headers), self.now))
        if conn_id in self.open and head != 200:
            self.open.pop(conn_id, None)
            caused += self.take(self.core.response_end(conn_id, self.now))
        self.run(Output(tuple(caused)))

    # -- delivery ----------------------------------------------------------------------

    def deliver(self, conn_id: int, n: int = 1) -> None:
        conn = self.open.get(conn_id)
        if conn is None:
            return
        for _ in range(n):
            if conn.chunks:
                chunk = conn.chunks.pop(0)
                conn.delivered.append(chunk)
                self.run(self.core.response_data(conn_id, chunk, self.now))
                if conn_id not in self.open:
                    return
            elif not conn.hold_open:
                self.open.pop(conn_id, None)
                self.run(self.core.response_end(conn_id, self.now))
                return

    def push(self, sid: str) -> None:
        """A server notification, delivered live to whichever connection carries that stream."""
        for stream_id, chunk in self.server.push_notification(sid):
            for conn in self.open.values():
                if conn.stream == (sid, stream_id):
                    conn.chunks.append(chunk)

    def settle(self, max_steps: int = 10_000, *, patience: float | None = None) -> None:
        """Deliver everything, and run timers, until nothing is left to do (or nothing
        will happen within `patience` seconds of model time)."""
        for _ in range(max_steps):
            busy = [c for c in self.open.values() if c.chunks or not c.hold_open]
            if busy:
                self.deliver(busy[0].conn_id)
                continue
            wake = self.core.next_wakeup()
            if wake is None or (patience is not None and wake - self.now > patience):
                return
            self.advance_to(wake)
        raise AssertionError("link did not settle")

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)
        self.run(self.core.tick(self.now))

    # -- faults ------------------------------------------------------------------------

    def cut(self, conn_id: int) -> None:
        if self.open.pop(conn_id, None) is not None:
            self.run(self.core.connection_failed(conn_id, self.now))

    def polling_close(self, conn_id: int, retry_ms: int) -> None:
        conn = self.open.pop(conn_id, None)
        if conn is not None:
            self.run(self.core.response_data(conn_id, encode_event(None, retry=retry_ms), self.now))
            self.run(self.core.response_end(conn_id, self.now))

    def replay_delivered(self, conn_id: int) -> None:
        conn = self.open.get(conn_id)
        if conn is not None and conn.delivered:
            conn.chunks.insert(0, self.server.rng.choice(conn.delivered))

    def inject(self, conn_id: int, chunk: bytes) -> None:
        conn = self.open.get(conn_id)
        if conn is not None:
            conn.chunks.insert(0, chunk)

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
        return None

    def foreign_chunk(self, sid: str, *, same_session: bool, not_stream: str | None = None) -> bytes | None:
        """An event (with its genuine ID) of another stream of `sid`, or of another session."""
        pool = [
            (eid, data)
            for s in self.server.sessions.values()
            if (s.sid == sid) == same_session
            for st in s.streams.values()
            if st.stream_id != not_stream
            for eid, data in st.events
            if data
        ]
        if not pool:
            return None
        eid, data = self.server.rng.choice(pool)
        return encode_event(data, id=eid)

    def conns(self, purpose: Purpose | None = None) -> list[int]:
        return sorted(c for c, o in self.open.items() if purpose is None or o.req.purpose is purpose)
