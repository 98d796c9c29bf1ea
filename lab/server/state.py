"""Sessions, streams and the event store of the reference server (in memory, one event loop).

Every mutation happens on the server's single asyncio loop and none of them awaits, so
a resumption's switch from replay to live cannot lose or repeat an event: `attach` puts
the backlog (events after the cursor) into the connection and makes it the stream's
subscriber in one synchronous step, and every later `emit` goes to that subscriber.

A stream outlives its connections: a tool keeps running when the client's connection
drops (a dropped connection is not a cancellation), its events are stored, and a GET with
`Last-Event-ID` replays what was missed on *that stream only*.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections import deque
from dataclasses import dataclass, field

from lab.server import ledger as L
from lab.server.config import ServerConfig
from lab.wire import jsonrpc
from lab.wire.event_ids import CursorVerdict, EventIdCodec, message_digest, post_stream_id, session_tag
from lab.wire.redact import Redactor
from lab.wire.revisions import revision
from lab.wire.sse import encode_event


@dataclass(slots=True)
class StoredEvent:
    seq: int
    event_id: str | None
    data: str
    wire: bytes
    kind: str
    jsonrpc_id: str | None


class LiveConn:
    """One HTTP response streaming one stream: a buffer the connection task drains."""

    __slots__ = ("close_after", "conn", "end_reason", "ended", "pending", "retry_ms", "sent", "wake")

    def __init__(self, conn: str | None) -> None:
        self.conn = conn
        self.pending: list[bytes] = []
        self.wake = asyncio.Event()
        self.ended = False
        self.end_reason = ""
        self.sent = 0
        self.close_after: int | None = None
        self.retry_ms: int | None = None

    def push(self, wire: bytes, counts: bool = True) -> None:
        if self.ended:
            return
        self.pending.append(wire)
        if counts:
            self.sent += 1
        self.wake.set()

    def end(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self.end_reason = reason
            self.wake.set()

    def take(self) -> bytes:
        data = b"".join(self.pending)
        self.pending.clear()
        self.wake.clear()
        return data


@dataclass(eq=False, slots=True)
class Stream:
    session: Session
    stream_id: str
    opened_by: str
    request_id: jsonrpc.JsonRpcId | None
    resumable: bool
    generation: int
    opened_at: float
    close_after: int | None = None
    retry_ms: int | None = None
    events: deque[StoredEvent] = field(default_factory=deque)
    next_seq: int = 0
    complete: bool = False
    subscriber: LiveConn | None = None
    last_acked: str | None = None
    closed_at: float | None = None
    close_reason: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def last_sent(self) -> str | None:
        return self.events[-1].event_id if self.events else None


@dataclass(eq=False, slots=True)
class Session:
    sid: str
    pseudonym: str
    tag: str
    subject: str | None
    version: str
    generation: int
    created_at: float
    last_seen: float
    resumable: bool
    alive: bool = True
    end_reason: str | None = None
    streams: dict[str, Stream] = field(default_factory=dict)
    request_ids: set[jsonrpc.JsonRpcId] = field(default_factory=set)
    gets: int = 0
    standalone: Stream | None = None


class ServerState:
    def __init__(self, config: ServerConfig, ledger: L.Ledger) -> None:
        self.config = config
        self.ledger = ledger
        self.codec = EventIdCodec(config.event_id_key or secrets.token_bytes(32))
        self.redactor = Redactor(config.ledger_key)
        self.sessions: dict[str, Session] = {}
        self.receipts: dict[tuple[str | None, str], str] = (
            L.load_receipts(ledger.path) if ledger.path is not None else {}
        )
        self.generation = 0
        self.kept_generations: set[int] = {0}
        self.rollback = config.rollback

    # -- sessions ----------------------------------------------------------------------

    def create_session(self, subject: str | None, version: str, result_body: str, now: float) -> Session:
        sid = secrets.token_urlsafe(32)  # 256 bits, visible ASCII only, as the spec requires
        frac = int.from_bytes(hashlib.sha256(sid.encode()).digest()[:4], "big") / 2**32
        resumable = frac < self.config.resumable_fraction
        s = Session(
            sid=sid,
            pseudonym=self.redactor.session(sid) or "",
            tag=session_tag(sid),
            subject=subject,
            version=version,
            generation=self.generation,
            created_at=now,
            last_seen=now,
            resumable=resumable,
        )
        self.sessions[sid] = s
        self.ledger.write(
            L.INSERT_SESSION,
            (
                s.pseudonym,
                subject,
                subject,
                hashlib.sha256(result_body.encode()).hexdigest(),
                version,
                ",".join(self.config.allowed_origins),
                now,
                now + self.config.session_ttl,
                s.generation,
                int(resumable),
                int(not resumable),
                None,
                None,
            ),
        )
        return s

    def end_session(self, s: Session, reason: str, now: float) -> None:
        if not s.alive:
            return
        s.alive = False
        s.end_reason = reason
        self.sessions.pop(s.sid, None)
        close = "session_deleted" if reason == "deleted" else "session_expired"
        for st in s.streams.values():
            if st.task is not None and not st.task.done():
                st.task.cancel()
            self.close_stream(st, close, now)
        self.ledger.write(L.END_SESSION, (now, reason, s.last_seen + self.config.session_ttl, s.pseudonym))

    def sweep(self, now: float) -> None:
        """Expire idle sessions and forget completed streams past their grace period."""
        ttl = self.config.session_ttl
        for s in list(self.sessions.values()):
            live = any(st.subscriber is not None for st in s.streams.values())
            if not live and now - s.last_seen > ttl:
                self.end_session(s, "expired", now)
                continue
            for st in list(s.streams.values()):
                if (
                    st.complete
                    and st.closed_at is not None
                    and now - st.closed_at > self.config.completed_stream_ttl
                ):
                    del s.streams[st.stream_id]
        if self.rollback:
            alive_gens = {s.generation for s in self.sessions.values()}
            self.kept_generations = {g for g in self.kept_generations if g in alive_gens} | {self.generation}

    def start_rollback(self) -> None:
        """New streams stop being resumable; cursors of earlier generations stay valid
        until their sessions expire (the index is kept, never deleted)."""
        if not self.rollback:
            self.rollback = True
            self.kept_generations.add(self.generation)
            self.generation += 1
            self.kept_generations.add(self.generation)

    # -- streams -----------------------------------------------------------------------

    def _resumable(self, s: Session) -> bool:
        return s.resumable and not self.rollback

    def open_post_stream(
        self, s: Session, request_id: jsonrpc.JsonRpcId, payload_digest: str, conn: str | None, now: float
    ) -> Stream:
        st = Stream(
            s, post_stream_id(s.tag, request_id), "POST", request_id, self._resumable(s), self.generation, now
        )
        self._register(st, payload_digest, conn)
        return st

    def open_standalone(self, s: Session, conn: str | None, now: float) -> Stream:
        s.gets += 1
        st = Stream(s, f"g{s.gets}", "GET", None, self._resumable(s), self.generation, now)
        self._register(st, None, conn)
        s.standalone = st
        return st

    def _register(self, st: Stream, payload_digest: str | None, conn: str | None) -> None:
        s = st.session
        s.streams[st.stream_id] = st
        self.ledger.write(
            L.INSERT_STREAM,
            (
                s.pseudonym,
                st.stream_id,
                st.opened_by,
                None if st.request_id is None else str(st.request_id),
                payload_digest,
                conn,
                st.opened_at,
                None,
                None,
                None,
                None,
                None,
            ),
        )
        if st.resumable and revision(s.version).priming_event:
            self.emit(st, "", "priming", None, st.opened_at)

    def emit(self, st: Stream, data: str, kind: str, jsonrpc_id: str | None, now: float) -> StoredEvent:
        """Append an event to a stream, send it to the live connection if there is one."""
        s = st.session
        seq = st.next_seq
        st.next_seq += 1
        digest = message_digest(data)
        event_id = (
            self.codec.mint(s.tag, st.generation, st.stream_id, seq, data, digest=digest)
            if st.resumable
            else None
        )
        ev = StoredEvent(seq, event_id, data, encode_event(data, id=event_id), kind, jsonrpc_id)
        # Stored even when not resumable: events emitted before the first connection
        # attaches (the priming event, a fast tool) are delivered from here.
        st.events.append(ev)
        if len(st.events) > self.config.event_retention:
            st.events.popleft()
        sub = st.subscriber
        final = kind in ("response", "error")
        if final:
            st.complete = True
        self.ledger.write(
            L.INSERT_EVENT,
            (
                s.pseudonym,
                st.stream_id,
                event_id,
                seq,
                digest,
                kind,
                jsonrpc_id,
                now,
                0,
                None if sub is None else sub.conn,
            ),
        )
        if sub is not None:
            sub.push(ev.wire)
            if not final:
                self._maybe_poll_close(st, sub, now)
        if final:
            self.close_stream(st, "completed", now)
        return ev

    def _maybe_poll_close(self, st: Stream, sub: LiveConn, now: float) -> None:
        """Server-initiated close (polling): after N events on this connection, send `retry`
        and end the connection while the stream goes on."""
        if st.close_after is not None and sub.sent >= st.close_after and not st.complete and st.resumable:
            sub.push(encode_event(None, retry=st.retry_ms or 1000), counts=False)
            self.detach(st, sub, "server_close_polling", now)
            sub.end("server_close_polling")

    def attach(self, st: Stream, live: LiveConn, after_seq: int | None, now: float) -> int:
        """Make `live` the stream's connection; queue the stored events after `after_seq`
        first (None: the stream is new, so all of them, and they are not replays).

        Returns how many events were queued. A previous connection of the stream is ended
        (one connection per stream: no message goes out on two)."""
        old = st.subscriber
        if old is not None and old is not live:
            old.end("superseded")
        replay = after_seq is not None
        queued = 0
        for ev in st.events:
            if ev.seq > (after_seq if after_seq is not None else -1):
                live.push(ev.wire)
                queued += 1
                if replay:
                    self.ledger.write(
                        L.INSERT_EVENT,
                        (
                            st.session.pseudonym,
                            st.stream_id,
                            ev.event_id,
                            ev.seq,
                            message_digest(ev.data),
                            ev.kind,
                            ev.jsonrpc_id,
                            now,
                            1,
                            live.conn,
                        ),
                    )
        live.close_after = st.close_after
        if st.complete:
            live.end("completed")
            return queued
        st.subscriber = live
        if queued:
            self._maybe_poll_close(st, live, now)
        return queued

    def detach(self, st: Stream, live: LiveConn, reason: str, now: float) -> None:
        if st.subscriber is live:
            st.subscriber = None
            if not st.complete and reason == "client_gone" and st.opened_by == "GET" and not st.resumable:
                self.close_stream(st, "client_gone", now)

    def close_stream(self, st: Stream, reason: str, now: float) -> None:
        if st.closed_at is not None:
            return
        st.closed_at = now
        st.close_reason = reason
        sub = st.subscriber
        if sub is not None:
            sub.end(reason)
            st.subscriber = None
        s = st.session
        self.ledger.write(
            L.CLOSE_STREAM,
            (now, reason, st.last_sent, st.last_acked, st.retry_ms, s.pseudonym, st.stream_id),
        )

    # -- cursors -----------------------------------------------------------------------

    def resolve_cursor(self, s: Session, cursor: str) -> tuple[str, Stream | None, int]:
        """Where does `cursor` (a Last-Event-ID) point in session `s`?

        Returns (verdict, stream, sequence); the verdict is a `CursorVerdict` value or
        `unknown_stream` / `evicted` / `not_resumable`."""
        verdict, parsed = self.codec.classify(cursor, session_tag=s.tag, generations=self.kept_generations)
        if verdict is not CursorVerdict.VALID or parsed is None:
            return str(verdict), None, -1
        st = s.streams.get(parsed.stream_id)
        if st is None:
            return "unknown_stream", None, -1
        if not st.resumable:
            return "not_resumable", None, -1
        if st.events and parsed.sequence < st.events[0].seq - 1:
            return "evicted", None, -1
        if parsed.sequence >= st.next_seq:
            return str(CursorVerdict.TAMPERED), None, -1
        st.last_acked = cursor
        self.ledger.write(L.ACK_STREAM, (cursor, s.pseudonym, st.stream_id))
        return str(CursorVerdict.VALID), st, parsed.sequence

    def shutdown(self, now: float) -> None:
        for s in list(self.sessions.values()):
            for st in s.streams.values():
                if st.closed_at is None:
                    self.close_stream(st, "shutdown", now)
