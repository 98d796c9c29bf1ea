"""Sessions, streams and the event store of the reference server (in memory, one event loop).

Every mutation happens on the server's single asyncio loop and none of them awaits, so
a resumption's switch from replay to live cannot lose or repeat an event: `attach` puts
the backlog (events after the cursor) into the connection and makes it the stream's
subscriber in one synchronous step, and every later `emit` goes to that subscriber.

A stream outlives its connections: a tool keeps running when the client's connection
drops (a dropped connection is not a cancellation), its events are stored, and a GET with
`Last-Event-ID` replays what was missed on *that stream only*.

This class holds everything in memory only: a restart loses it. With `lab serve --store
FILE` the server runs its subclass `DurableState` (durable.py), which records every change
in a store and restores from it; this class records nothing, so its path is unchanged.

Everything held is bounded (ServerConfig says how, and what happens at each limit):
sessions (`max_sessions`), open streams per session (`max_session_streams`), events
retained per session in bytes (`max_session_event_bytes`) and per stream in count
(`event_retention`), and each connection's unsent backlog.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from lab.server import ledger as L
from lab.server.config import ServerConfig
from lab.server.cursors import UNKNOWN_CURSOR, EventNaming, PerStreamNaming, naming
from lab.server.defects import Defect, SharedEventStore
from lab.server.model import EVENT_OVERHEAD, LiveConn, Session, StoredEvent, Stream
from lab.wire import jsonrpc
from lab.wire.event_ids import message_digest, post_stream_id, session_tag
from lab.wire.redact import Redactor
from lab.wire.revisions import revision
from lab.wire.sse import encode_event

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""`notifications/message` levels, lowest first (RFC 5424 severities, as MCP names them)."""

_EVICTION_SCAN = 256
"""Sessions looked at, least recently used first, for one to evict at `max_sessions`."""


class Full(Exception):
    """A bound was reached and nothing could be freed: `what` says which."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@dataclass(frozen=True, slots=True)
class Resumption:
    """Where a cursor points: the stream to continue, and what to replay first."""

    stream: Stream
    backlog: list[StoredEvent]


class ServerState:
    def __init__(self, config: ServerConfig, ledger: L.Ledger) -> None:
        self.config = config
        self.ledger = ledger
        self.defects = frozenset(Defect(d) for d in config.defects)
        self.names: EventNaming = (
            PerStreamNaming()  # defect per-stream-ids: one counter per stream
            if Defect.PER_STREAM_IDS in self.defects
            else naming(config.event_ids, config.event_id_key)
        )
        self.redactor = Redactor(config.ledger_key, cache_size=0)  # a pseudonym is made once per session
        self.sessions: dict[str, Session] = {}
        """Least recently used first (`touch` moves a session to the end)."""
        self.receipts: dict[tuple[str | None, str], str] = (
            L.load_receipts(ledger.path) if ledger.path is not None else {}
        )
        self.generation = 0
        self.kept_generations: set[int] = {0}
        self.rollback = config.rollback
        self.resumable_fraction = config.resumable_fraction
        """Rollout: the share of new sessions made resumable (`--resumable-fraction`; the
        admin control changes it live, for sessions created from then on)."""
        self.emitted = 0
        self._indexed = self.names.scheme != "e1"  # opaque IDs need the cursor index
        self._retention = config.event_retention
        self._byte_cap = config.max_session_event_bytes
        self.shared: SharedEventStore[StoredEvent] | None = (
            SharedEventStore(config.event_retention) if Defect.SHARED_EVENT_STORE in self.defects else None
        )

    # -- sessions ----------------------------------------------------------------------

    def create_session(self, subject: str | None, version: str, result_body: str, now: float) -> Session:
        """A new session; at `max_sessions` the least recently used idle one is evicted
        first, and if none is idle: Full("sessions")."""
        if len(self.sessions) >= self.config.max_sessions and not self._evict_idle_session(now):
            raise Full("sessions")
        sid = secrets.token_urlsafe(32)  # 256 bits, visible ASCII only, as the spec requires
        frac = int.from_bytes(hashlib.sha256(sid.encode()).digest()[:4], "big") / 2**32
        resumable = frac < self.resumable_fraction
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

    def latest_session(self, subject: str | None) -> Session | None:
        """The live session of `subject` used most recently (for the defect
        serve-without-session only: a linear scan from the most recently used end)."""
        for s in reversed(self.sessions.values()):
            if s.alive and s.subject == subject:
                return s
        return None

    def touch(self, s: Session, now: float) -> None:
        """`s` was used now: it moves to the most recently used end."""
        s.last_seen = now
        self.sessions[s.sid] = self.sessions.pop(s.sid)

    def _evict_idle_session(self, now: float) -> bool:
        for i, s in enumerate(self.sessions.values()):
            if i >= _EVICTION_SCAN:
                return False
            if not s.busy:
                self.end_session(s, "evicted", now)
                return True
        return False

    def end_session(self, s: Session, reason: str, now: float) -> None:
        if not s.alive:
            return
        s.alive = False
        s.end_reason = reason
        self.sessions.pop(s.sid, None)
        close = {"deleted": "session_deleted", "evicted": "session_evicted"}.get(reason, "session_expired")
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
                    self._forget_stream(st)
        if self.rollback:
            alive_gens = {s.generation for s in self.sessions.values()}
            self.kept_generations = {g for g in self.kept_generations if g in alive_gens} | {self.generation}

    def start_rollback(self, *, keep_index: bool = True) -> None:
        """New streams stop being resumable; cursors of earlier generations stay valid
        until their sessions expire (the index is kept, never deleted).

        `keep_index=False` is the unacceptable rollback (admin knob `rollback:
        drop-index`, there to prove the lab catches it): the old generation's cursor index
        is dropped at once, so every cursor of a stream opened before is refused
        (`other_generation`) although its session lives on."""
        if not self.rollback:
            self.rollback = True
            self.kept_generations.add(self.generation)
            self.generation += 1
            self.kept_generations.add(self.generation)
        if not keep_index:
            self.kept_generations = {self.generation}

    def set_log_level(self, s: Session, level: str) -> None:
        """`logging/setLevel`: the lowest level of `notifications/message` sent to `s`."""
        s.log_level = level

    def log_message(self, s: Session, level: str, logger: str, data: Any, now: float) -> None:
        """A `notifications/message` on the session's standalone stream, if it has one and
        the level is at or above what the client asked for (`logging/setLevel`)."""
        g = s.standalone
        if g is None or g.closed_at is not None:
            return
        if s.log_level is not None and LOG_LEVELS.index(level) < LOG_LEVELS.index(s.log_level):
            return
        note = jsonrpc.notification("notifications/message", {"level": level, "logger": logger, "data": data})
        self.emit(g, jsonrpc.dumps(note), "notification", None, now)

    # -- streams -----------------------------------------------------------------------

    def _resumable(self, s: Session) -> bool:
        return s.resumable and not self.rollback

    def open_post_stream(
        self, s: Session, request_id: jsonrpc.JsonRpcId, payload_digest: str, conn: str | None, now: float
    ) -> Stream:
        self._make_room(s, now)
        st = Stream(
            s, post_stream_id(s.tag, request_id), "POST", request_id, self._resumable(s), self.generation, now
        )
        self._register(st, payload_digest, conn)
        return st

    def open_standalone(self, s: Session, conn: str | None, now: float) -> Stream:
        self._make_room(s, now)
        s.gets += 1
        st = Stream(s, f"g{s.gets}", "GET", None, self._resumable(s), self.generation, now)
        self._register(st, None, conn)
        s.standalone = st
        return st

    def set_polling(self, st: Stream, close_after: int, retry_ms: int) -> None:
        """The ticker's `close_after`: close the connection every `close_after` events it
        carried, advising `retry_ms` first (the stream goes on)."""
        st.close_after = close_after
        st.retry_ms = retry_ms
        if st.subscriber is not None:
            st.subscriber.close_after = close_after

    def _make_room(self, s: Session, now: float) -> None:
        """At `max_session_streams`, close the oldest standalone stream nobody is connected
        to (an abandoned GET); Full("streams") if there is none."""
        if s.open_streams < self.config.max_session_streams:
            return
        for st in s.streams.values():
            if st.opened_by == "GET" and st.closed_at is None and st.subscriber is None:
                st.complete = True  # nothing more will be sent on it: forgotten after the grace period
                self.close_stream(st, "abandoned", now)
                return
        raise Full("streams")

    def _register(self, st: Stream, payload_digest: str | None, conn: str | None) -> None:
        s = st.session
        s.streams[st.stream_id] = st
        s.open_streams += 1
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
        if Defect.NO_PRIMING in self.defects:  # defect: streams start without their priming event
            return
        if st.resumable and revision(s.version).priming_event:
            self.emit(st, "", "priming", None, st.opened_at)

    def emit(self, st: Stream, data: str, kind: str, jsonrpc_id: str | None, now: float) -> StoredEvent:
        """Append an event to a stream, send it to the live connection if there is one."""
        s = st.session
        seq = st.next_seq
        st.next_seq += 1
        self.emitted += 1
        digest = message_digest(data)
        event_id = self.names.mint(st, seq, self.emitted, digest) if st.resumable else None
        wire = encode_event(data, id=event_id)
        ev = StoredEvent(seq, self.emitted, event_id, wire, digest, kind, jsonrpc_id)
        # Stored even when not resumable: events emitted before the first connection
        # attaches (the priming event, a fast tool) are delivered from here.
        st.events.append(ev)
        s.retained += len(wire) + EVENT_OVERHEAD  # = ev.cost, without a call on this hot path
        if self._indexed:
            self.names.remember(st, ev)
        if self.shared is not None:  # defect shared-event-store: every session's events in one store
            self.shared.add(SharedEventStore.key(st.request_id), ev)
        if len(st.events) > self._retention:
            self._drop_oldest(st)
        if s.retained > self._byte_cap:
            self._trim(s, st)
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

    def _drop_oldest(self, st: Stream) -> None:
        ev = st.events.popleft()
        st.session.retained -= ev.cost
        self.names.forget(st.session, ev)

    def _forget_stream(self, st: Stream) -> None:
        s = st.session
        del s.streams[st.stream_id]
        for ev in st.events:
            s.retained -= ev.cost
            self.names.forget(s, ev)
        st.events.clear()

    def _trim(self, s: Session, growing: Stream) -> None:
        """Bring the session's retained events under `max_session_event_bytes`: completed
        streams go first (oldest first), then the oldest events of the growing stream
        (its newest is kept), then of the others."""
        cap = self.config.max_session_event_bytes
        for st in list(s.streams.values()):
            if s.retained <= cap:
                return
            if st is not growing and st.complete and st.closed_at is not None:
                self._forget_stream(st)
        while s.retained > cap and len(growing.events) > 1:
            self._drop_oldest(growing)
        for st in s.streams.values():
            if st is growing:
                continue
            while s.retained > cap and st.events:
                self._drop_oldest(st)

    def _maybe_poll_close(self, st: Stream, sub: LiveConn, now: float) -> None:
        """Server-initiated close (polling): after N events on this connection, send `retry`
        and end the connection while the stream goes on."""
        if st.close_after is not None and sub.sent >= st.close_after and not st.complete and st.resumable:
            if Defect.NO_RETRY_FIELD not in self.defects:  # defect: close without advising `retry`
                sub.push(encode_event(None, retry=1000 if st.retry_ms is None else st.retry_ms), counts=False)
            self.detach(st, sub, "server_close_polling", now)
            sub.end("server_close_polling")

    def attach(self, st: Stream, live: LiveConn, backlog: list[StoredEvent] | None, now: float) -> int:
        """Make `live` the stream's connection; queue `backlog` first (a resumption's
        replay), or, for a stream just opened (None), every event it holds already.

        Returns how many events were queued. A previous connection of the stream is ended
        (one connection per stream: no message goes out on two)."""
        old = st.subscriber
        if old is not None and old is not live:
            old.end("superseded")
        replay = backlog is not None
        events = list(st.events) if backlog is None else backlog
        for ev in events:
            live.push(ev.wire)
            if replay:
                self.ledger.write(
                    L.INSERT_EVENT,
                    (
                        st.session.pseudonym,
                        st.stream_id,
                        ev.event_id,
                        ev.seq,
                        ev.digest,
                        ev.kind,
                        ev.jsonrpc_id,
                        now,
                        1,
                        live.conn,
                    ),
                )
        live.close_after = st.close_after
        if st.complete or live.ended:
            live.end("completed")
            return len(events)
        st.subscriber = live
        if events:
            self._maybe_poll_close(st, live, now)
        return len(events)

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
        s = st.session
        s.open_streams -= 1
        sub = st.subscriber
        if sub is not None:
            sub.end(reason)
            st.subscriber = None
        self.ledger.write(
            L.CLOSE_STREAM,
            (now, reason, st.last_sent, st.last_acked, st.retry_ms, s.pseudonym, st.stream_id),
        )

    # -- cursors -----------------------------------------------------------------------

    def resolve_cursor(self, s: Session, cursor: str) -> Resumption | str:
        """Where does `cursor` (a Last-Event-ID) point in session `s`?

        A `Resumption`, or the verdict that refuses it: a `CursorVerdict` value or
        `unknown_stream` / `unknown_cursor` / `evicted` / `not_resumable`."""
        if self.shared is not None:  # defect shared-event-store: the cursor is looked up across sessions
            return self._resolve_shared(s, cursor)
        verdict, st, seq = self.names.locate(s, cursor, self.kept_generations)
        if st is None:
            return verdict
        st.last_acked = cursor
        self.ledger.write(L.ACK_STREAM, (cursor, s.pseudonym, st.stream_id))
        return Resumption(st, self._backlog(st, seq))

    def _backlog(self, st: Stream, after_seq: int) -> list[StoredEvent]:
        """What a resumption from `after_seq` replays: that stream's events after it. Four
        defects change it, here and nowhere else."""
        if Defect.RESUME_FORGET in self.defects:  # defect: what was sent after the cursor is forgotten
            return []
        if Defect.REPLAY_FROM_START in self.defects:  # defect: the cursor is ignored
            after_seq = -1
        events = [ev for ev in st.events if ev.seq > after_seq]
        if Defect.REPLAY_OTHER_STREAMS in self.defects:  # defect: the session's other streams too
            since = next((ev.order for ev in st.events if ev.seq == after_seq), -1)
            others = [
                ev for o in st.session.streams.values() if o is not st for ev in o.events if ev.order > since
            ]
            events = sorted(events + others, key=lambda ev: ev.order)
        if Defect.REPLAY_MISORDERED in self.defects:  # defect: the response jumps ahead of its progress
            final = [ev for ev in events if ev.kind in ("response", "error")]
            events = final + [ev for ev in events if ev.kind not in ("response", "error")]
        return events

    def _resolve_shared(self, s: Session, cursor: str) -> Resumption | str:
        assert self.shared is not None
        found = self.shared.after(cursor)
        if found is None:
            return UNKNOWN_CURSOR
        key, backlog = found
        own = [st for st in s.streams.values() if SharedEventStore.key(st.request_id) == key]
        if own:
            return Resumption(own[-1], backlog)
        # No stream of this session has that key: replay, then end (a finished stream).
        ghost = Stream(s, f"shared-{len(s.streams)}", "GET", None, True, self.generation, 0.0, complete=True)
        return Resumption(ghost, backlog)

    def shutdown(self, now: float) -> None:
        for s in list(self.sessions.values()):
            for st in s.streams.values():
                if st.closed_at is None:
                    self.close_stream(st, "shutdown", now)
