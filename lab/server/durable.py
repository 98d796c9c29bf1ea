"""The reference server's state kept in a store (`lab serve --store FILE`): `DurableState`
is `ServerState` recording every change to a `Store` (store.py), and restored from it
when the server starts again. Without a store the server runs `ServerState` itself, which
records nothing: the path of every event is the same as ever.

What a restart keeps (docs/targets.md, "Restarts and the store"):
- the live sessions, least recently used first, with their log level, request IDs and
  standalone-stream counter, each as idle as it was at the stop (the time the server
  was down does not count, and a session with a live stream counts as used then);
- their streams and retained events, so that a cursor handed out before the restart
  resumes after it: `e1` IDs still verify (the key is the store's), the index of opaque
  IDs is built again;
- the server-wide event counter, the cursor generation and the generations kept.

What it does to what was going on:
- a POST stream whose tool was running (its task is gone) gets a final JSON-RPC error for
  its request, emitted as any answer is (stored, ledgered, with an event ID): a client
  that resumes it replays what it missed, then the error, and the stream ends;
- a standalone stream stays open and resumable (one that is not resumable, which nobody
  can ever attach to again, is closed `client_gone`, as when its connection goes).

A graceful stop pauses the streams: the store keeps them open, and the ledger records
their close with reason `paused`; after a restart, a later close of such a stream
updates that row. A restored server never inserts a session or stream row again.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass

from lab.server import ledger as L
from lab.server.config import ServerConfig
from lab.server.model import Session, StoredEvent, Stream
from lab.server.state import Resumption, ServerState
from lab.server.store import Snapshot, Store
from lab.wire import jsonrpc
from lab.wire.event_ids import session_tag

INTERRUPTED = "interrupted by a server restart: this call's outcome is unknown"
"""The message of the error a call still running at a stop gets after the restart."""

LOST_EVENTS_GAP = 1_000_000
"""After a stop that was not clean (SIGKILL, a crash) the store may have lost its last
batch, whose events a client may hold. The server-wide event counter (the `seq` scheme's
IDs) then jumps this far, more than the server emits in a minute at full speed, so that
no ID handed out before is minted again for another event."""
LOST_STREAMS_GAP = 1_000
"""The same for each session's standalone-stream counter (stream IDs `g<n>`)."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What a start found in the store (counts only: `lab serve` prints them)."""

    sessions: int
    streams: int
    events: int
    interrupted: int
    clean: bool


class DurableState(ServerState):
    def __init__(self, config: ServerConfig, ledger: L.Ledger, store: Store, now: float) -> None:
        snap = store.snapshot
        stored_key = snap.meta.get("event_id_key")
        try:
            key = bytes.fromhex(stored_key) if stored_key else config.event_id_key or secrets.token_bytes(32)
        except ValueError:
            raise ValueError(f"{store.path}: the store's event-ID key is not hex") from None
        super().__init__(dataclasses.replace(config, event_id_key=key), ledger)
        scheme = snap.meta.get("event_ids")
        if scheme is not None and scheme != self.names.scheme:
            raise ValueError(
                f"{store.path}: the store holds event IDs of scheme {scheme}, this server mints "
                f"{self.names.scheme}: start it with the settings the store was written with, or a new store"
            )
        self.store = store
        self.restored: Restored | None = None
        self._stopped = False
        self._live_noted_at = now
        store.start({"event_ids": self.names.scheme, "event_id_key": key.hex()})
        if scheme is not None:  # a store a server ran with: its counters, even with no session left
            try:
                self.restored = self._restore(snap, now)
            except (ValueError, TypeError, KeyError) as e:
                raise ValueError(f"{store.path}: cannot restore from the store: {e!r}") from None
        store.handoff()

    # -- restore -----------------------------------------------------------------------

    def _restore(self, snap: Snapshot, now: float) -> Restored:
        meta = snap.meta
        clean = meta.get("clean") == "1"
        stopped = float(meta.get("stopped_at" if clean else "saved_at") or now)
        self._restore_sessions(snap, max(0.0, now - stopped))
        numbered = self._restore_streams(snap)
        events, order = self._restore_events(snap, numbered)
        self.emitted = max(int(meta.get("emitted") or 0), order)
        self.generation = int(meta.get("generation") or 0)
        kept = meta.get("kept_generations")
        self.kept_generations = {int(g) for g in kept.split(",")} if kept else {self.generation}
        self.rollback = self.rollback or meta.get("rollback") == "1"
        if not clean:  # IDs of the batch the store may have lost are never minted again
            self.emitted += LOST_EVENTS_GAP
            self.store.meta({"emitted": str(self.emitted)})
            for s in self.sessions.values():
                s.gets += LOST_STREAMS_GAP
                self.store.session_gets(s)
        interrupted = self._end_what_stopped(now)
        restores = str(int(meta.get("restores") or 0) + 1)
        self.store.meta({"restores": restores})
        self.ledger.write(L.INSERT_META, ("restores", restores))
        self.ledger.write(L.INSERT_META, ("restored_at", repr(now)))
        return Restored(len(self.sessions), len(numbered), events, interrupted, clean)

    def _restore_sessions(self, snap: Snapshot, shift: float) -> None:
        """The sessions, least recently used first; `shift`: the time the server was down,
        which is nobody's idleness."""
        for r in snap.sessions:
            s = Session(
                sid=r.sid,
                pseudonym=r.pseudonym,
                tag=session_tag(r.sid),
                subject=r.subject,
                version=r.version,
                generation=r.generation,
                created_at=r.created_at,
                last_seen=r.last_seen + shift,
                resumable=bool(r.resumable),
                gets=r.gets,
                log_level=r.log_level,
            )
            self.sessions[s.sid] = s
        for sid, rid in snap.request_ids:
            owner = self.sessions.get(sid)
            if owner is not None:
                owner.request_ids.add(json.loads(rid))

    def _restore_streams(self, snap: Snapshot) -> dict[int, Stream]:
        """The sessions' streams, in the order they opened; by the store's numbers."""
        numbered: dict[int, Stream] = {}
        for t in snap.streams:
            owner = self.sessions.get(t.sid)
            if owner is None:
                continue
            st = Stream(
                owner,
                t.stream_id,
                t.opened_by,
                None if t.request_id is None else json.loads(t.request_id),
                bool(t.resumable),
                t.generation,
                t.opened_at,
                close_after=t.close_after,
                retry_ms=t.retry_ms,
                next_seq=t.next_seq,
                complete=bool(t.complete),
                last_acked=t.last_acked,
                closed_at=t.closed_at,
                close_reason=t.close_reason,
            )
            owner.streams[st.stream_id] = st
            if st.closed_at is None:
                owner.open_streams += 1
            numbered[t.no] = st
            self.store.adopt(st, t.no)
        for s in self.sessions.values():
            s.standalone = s.streams.get(f"g{s.gets}")
        return numbered

    def _restore_events(self, snap: Snapshot, numbered: dict[int, Stream]) -> tuple[int, int]:
        """The streams' retained events, in the order they were emitted (the index of
        opaque IDs built as it was); how many, and the order of the last."""
        order = events = 0
        for e in snap.events:
            held = numbered.get(e.stream)
            if held is None:
                continue
            ev = StoredEvent(e.seq, e.ord, e.event_id, e.wire, e.digest, e.kind, e.jsonrpc_id)
            held.events.append(ev)
            held.session.retained += ev.cost
            if self._indexed:
                self.names.remember(held, ev)
            order = max(order, e.ord)
            events += 1
        return events, order

    def _end_what_stopped(self, now: float) -> int:
        """A call whose tool was running gets its error; a standalone stream nobody can
        resume is closed as when its connection goes. How many calls were interrupted."""
        interrupted = 0
        for s in list(self.sessions.values()):
            for st in list(s.streams.values()):
                if st.closed_at is not None:
                    continue
                if st.opened_by == "POST":
                    self._interrupt(st, now)
                    interrupted += 1
                elif not st.resumable:
                    self.close_stream(st, "client_gone", now)
        return interrupted

    def _interrupt(self, st: Stream, now: float) -> None:
        """The answer of a call whose tool was running when the server stopped."""
        assert st.request_id is not None
        data = jsonrpc.dumps(jsonrpc.error(st.request_id, jsonrpc.INTERNAL_ERROR, INTERRUPTED))
        self.emit(st, data, "error", str(st.request_id), now)

    # -- every change, recorded --------------------------------------------------------

    def create_session(self, subject: str | None, version: str, result_body: str, now: float) -> Session:
        s = super().create_session(subject, version, result_body, now)
        self.store.session_created(s)
        return s

    def touch(self, s: Session, now: float) -> None:
        super().touch(s, now)
        self.store.session_touched(s)

    def end_session(self, s: Session, reason: str, now: float) -> None:
        if s.alive:
            super().end_session(s, reason, now)
            self.store.session_ended(s)

    def set_log_level(self, s: Session, level: str) -> None:
        super().set_log_level(s, level)
        self.store.session_level(s)

    def set_polling(self, st: Stream, close_after: int, retry_ms: int) -> None:
        super().set_polling(st, close_after, retry_ms)
        self.store.stream_polling(st)

    def _register(self, st: Stream, payload_digest: str | None, conn: str | None) -> None:
        self.store.stream_opened(st)  # before its priming event
        super()._register(st, payload_digest, conn)

    def emit(self, st: Stream, data: str, kind: str, jsonrpc_id: str | None, now: float) -> StoredEvent:
        ev = ServerState.emit(self, st, data, kind, jsonrpc_id, now)  # not super(): a hot path
        self.store.event(st, ev)
        return ev

    def _drop_oldest(self, st: Stream) -> None:
        super()._drop_oldest(st)
        self.store.stream_trimmed(st)

    def _forget_stream(self, st: Stream) -> None:
        super()._forget_stream(st)
        self.store.stream_forgotten(st)

    def close_stream(self, st: Stream, reason: str, now: float) -> None:
        if st.closed_at is None:
            super().close_stream(st, reason, now)
            self.store.stream_closed(st)

    def resolve_cursor(self, s: Session, cursor: str) -> Resumption | str:
        found = super().resolve_cursor(s, cursor)
        if isinstance(found, Resumption) and self.shared is None:
            self.store.stream_acked(found.stream)
        return found

    def start_rollback(self, *, keep_index: bool = True) -> None:
        super().start_rollback(keep_index=keep_index)
        self._record_generations()

    def sweep(self, now: float) -> None:
        kept = set(self.kept_generations)
        super().sweep(now)
        if kept != self.kept_generations:
            self._record_generations()
        if now - self._live_noted_at >= self.config.session_ttl / 4:
            self._live_noted_at = now
            self._note_live(now)

    def _record_generations(self) -> None:
        self.store.meta(
            {
                "generation": str(self.generation),
                "kept_generations": ",".join(str(g) for g in sorted(self.kept_generations)),
                "rollback": "1" if self.rollback else "0",
            }
        )

    def _note_live(self, now: float) -> None:
        """A live stream keeps its session alive: the store hears of it now and then (and
        at a stop), so that a restart does not take such a session for an idle one."""
        for s in self.sessions.values():
            if any(st.subscriber is not None for st in s.streams.values()):
                self.store.session_alive(s, now)

    def shutdown(self, now: float) -> None:
        """A stop is a pause: the connections end, the store keeps every stream open and
        is flushed and closed; the ledger records each open stream's close as `paused`."""
        if self._stopped:
            return
        self._stopped = True
        self._note_live(now)
        for s in self.sessions.values():
            for st in s.streams.values():
                if st.subscriber is not None:
                    st.subscriber.end("shutdown")
                    st.subscriber = None
                if st.closed_at is None:
                    self.ledger.write(
                        L.CLOSE_STREAM,
                        (now, "paused", st.last_sent, st.last_acked, st.retry_ms, s.pseudonym, st.stream_id),
                    )
        self.store.close(now)
