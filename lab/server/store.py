"""The reference server's durable store (`lab serve --store FILE`, `mcpServerStore.v1`,
SQLite): its sessions, their streams and stored events, so that a restart keeps them
(docs/targets.md, "Restarts and the store"; durable.py restores and records them).

This is the server's own private state file, not a ledger. It holds what the server
needs to go on after a restart, and so the raw session IDs (a request names its session
by that ID and by nothing else), the event-ID key (so that IDs minted before a restart
still verify after it) and every retained event as sent. The file is created 0600;
nothing in it is ever logged, and it belongs out of anything shared (a run folder is
searched for raw session IDs). The ledger (ledger.py) stays the evidence and never holds
a raw ID.

Writes never block the event loop. The loop records what changed in plain lists and
dicts of its own (no lock: only the loop touches them) and every ~50 ms hands the lot
over whole, one append to a deque, to a writer thread that commits each hand-over in
one transaction (WAL, synchronous=NORMAL). A hand-over happens between two steps of the
loop (a task of its own, `run_handoffs`), never inside one: an event, the close of its
stream and a trim it caused land together or not at all. Some changes are coalesced per
hand-over (a session used ten times is one row update; a stream's events are one row, and
its `next_seq` follows from them; a trim is one DELETE below the oldest event kept).

A SIGKILL loses at most what was not committed yet: the last hand-over or two. The
restored server is consistent with what the store holds (durable.py says how it keeps
IDs it may have handed out in the lost part from being minted again).

The writer cannot die silently: any failure (disk full, I/O error, a damaged file) is
fatal, like the ledger's. `failure` is set, a line goes to the log, later changes are
counted in `rows_lost`, and `lab serve` stops with exit 4.
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from lab.server.ledger import group_in_order
from lab.server.model import Session, StoredEvent, Stream
from lab.wire import jsonrpc

SCHEMA = "mcpServerStore.v1"
BATCH_S = 0.05
"""Seconds between two hand-overs to the writer (what a SIGKILL may lose)."""
IDLE_MARK_S = 1.0
"""An idle server still marks the store this often (`saved_at`), so that a restart after a
crash knows when the server was last seen running."""

log = logging.getLogger("lab.server.store")

# The store numbers each stream it keeps (`streams.no`). Events are kept in chunks: one
# row per stream and hand-over, its events packed (`marshal`: the store's own data, read
# back by the same server), so that SQLite writes a row per stream every ~50 ms, not one
# per event (a row per event, even small and appended, doubled the server's CPU per event
# under load: bench/bench_server.py --store). A trim deletes the chunks wholly below the
# stream's oldest event kept (`first_seq`) and a restore skips what is below it in a chunk.
_DDL = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS sessions (
    sid TEXT PRIMARY KEY, pseudonym TEXT NOT NULL, subject TEXT, version TEXT NOT NULL,
    generation INTEGER NOT NULL, resumable INTEGER NOT NULL, created_at REAL NOT NULL,
    last_seen REAL NOT NULL, touched INTEGER NOT NULL, log_level TEXT, gets INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS request_ids (
    sid TEXT, request_id TEXT, PRIMARY KEY (sid, request_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS streams (
    no INTEGER PRIMARY KEY, sid TEXT NOT NULL, stream_id TEXT NOT NULL, opened_by TEXT NOT NULL,
    request_id TEXT, resumable INTEGER NOT NULL, generation INTEGER NOT NULL, opened_at REAL NOT NULL,
    next_seq INTEGER NOT NULL, complete INTEGER NOT NULL, closed_at REAL, close_reason TEXT,
    close_after INTEGER, retry_ms INTEGER, last_acked TEXT, first_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    stream INTEGER NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL,
    packed BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS events_of_stream ON events (stream, last_seq);
"""

_META = "INSERT OR REPLACE INTO meta VALUES (?, ?)"
_INSERT_SESSION = "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?)"
_SESSION_LEVEL = "UPDATE sessions SET log_level=? WHERE sid=?"
_SESSION_GETS = "UPDATE sessions SET gets=? WHERE sid=?"
_END_SESSION = ("DELETE FROM sessions WHERE sid=?", "DELETE FROM request_ids WHERE sid=?")
_INSERT_REQUEST_ID = "INSERT OR IGNORE INTO request_ids VALUES (?, ?)"
_INSERT_STREAM = "INSERT INTO streams VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_STREAM_POLLING = "UPDATE streams SET close_after=?, retry_ms=? WHERE no=?"
_STREAM_CLOSE = "UPDATE streams SET complete=?, closed_at=?, close_reason=? WHERE no=?"
_STREAM_ACK = "UPDATE streams SET last_acked=? WHERE no=?"
_FORGET_STREAM = ("DELETE FROM streams WHERE no=?", "DELETE FROM events WHERE stream=?")
_INSERT_CHUNK = "INSERT INTO events VALUES (?,?,?,?)"
_NEXT_SEQ = "UPDATE streams SET next_seq=? WHERE no=?"
_TOUCH = "UPDATE sessions SET last_seen=MAX(last_seen, ?), touched=? WHERE sid=?"
_ALIVE = "UPDATE sessions SET last_seen=MAX(last_seen, ?) WHERE sid=?"
_TRIM = ("UPDATE streams SET first_seq=? WHERE no=?", "DELETE FROM events WHERE last_seq<? AND stream=?")


class StoreFailed(Exception):
    """The store's writer failed for good (`__cause__` says why); nothing more is kept."""


class SessionRow(NamedTuple):
    sid: str
    pseudonym: str
    subject: str | None
    version: str
    generation: int
    resumable: int
    created_at: float
    last_seen: float
    touched: int
    log_level: str | None
    gets: int


class StreamRow(NamedTuple):
    no: int
    """The store's number of the stream (its events name it so)."""
    sid: str
    stream_id: str
    opened_by: str
    request_id: str | None
    """JSON text of the request's ID (an integer and a string are two different IDs)."""
    resumable: int
    generation: int
    opened_at: float
    next_seq: int
    complete: int
    closed_at: float | None
    close_reason: str | None
    close_after: int | None
    retry_ms: int | None
    last_acked: str | None
    first_seq: int
    """Its oldest event kept (events below it in a chunk were trimmed)."""


class EventRow(NamedTuple):
    stream: int
    seq: int
    ord: int
    event_id: str | None
    wire: bytes
    digest: str
    kind: str
    jsonrpc_id: str | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a store held when it was opened: sessions least recently used first, streams
    in the order they opened, events in the order they were emitted."""

    meta: dict[str, str]
    sessions: list[SessionRow]
    request_ids: list[tuple[str, str]]
    streams: list[StreamRow]
    events: list[EventRow]


@dataclass(slots=True)
class _Batch:
    """One hand-over: the changes of whole loop steps, committed in one transaction."""

    events: list[tuple[Any, ...]] = field(default_factory=list)
    """Events as `EventRow` tuples, in order (the one change recorded per event: kept to
    a tuple; packed into chunks by the writer)."""
    ops: list[tuple[str, Sequence[Any]]] = field(default_factory=list)
    """Every other change as (statement, parameters), in order."""
    touches: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Session -> (last use, LRU clock): the latest per hand-over."""
    alive: dict[str, float] = field(default_factory=dict)
    """Session -> a time it had a live stream (a live stream keeps a session alive)."""
    trims: dict[int, int] = field(default_factory=dict)
    """Stream number -> its oldest event kept: the events below are deleted."""

    def __bool__(self) -> bool:
        return bool(self.events or self.ops or self.touches or self.alive or self.trims)


def request_id_text(rid: jsonrpc.JsonRpcId | None) -> str | None:
    return None if rid is None else jsonrpc.dumps(rid)


class Store:
    """Open (and read) a store; `start` it to record; `close` flushes and stops it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))  # private from birth
        try:
            with closing(sqlite3.connect(self.path)) as db:
                _check_schema(db, self.path)  # before anything is written into someone else's file
            with closing(self._connect()) as db:
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA,))
                db.commit()
                self.snapshot = _load(db)
        except (sqlite3.DatabaseError, EOFError, TypeError) as e:  # a damaged file or chunk
            raise ValueError(f"{self.path}: cannot read the store: {e}") from None
        self.clock = max((r.touched for r in self.snapshot.sessions), default=0)
        """The LRU clock: every use of a session takes the next value (restored in order)."""
        self._numbers: dict[Stream, int] = {}
        """The number of each stream kept (a stream the store does not know is not kept)."""
        self._next_number = max((r.no for r in self.snapshot.streams), default=0) + 1
        self._batch = _Batch()
        self._ready: deque[_Batch] = deque()
        """Hand-overs waiting for the writer (the loop appends, the writer pops: no lock)."""
        self._handed = 0
        self._committed = 0
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._marked_at = 0.0
        self.rows_written = 0
        self.rows_lost = 0
        self.failure: BaseException | None = None
        """Why the writer stopped for good; None while it works."""

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_DDL)
        return db

    def start(self, meta: dict[str, str]) -> None:
        """Write `meta` and mark the store in use (`clean` 0 until `close`), then start the
        writer. Not called: the file stays as it was found."""
        db = self._connect()
        try:
            rows = {"schema": SCHEMA, **meta, "clean": "0"}
            db.executemany(_META, list(rows.items()))
            db.commit()
        finally:
            db.close()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    # -- what changed (the event loop) ------------------------------------------------

    def meta(self, values: dict[str, str]) -> None:
        self._batch.ops.extend((_META, (k, v)) for k, v in values.items())

    def session_created(self, s: Session) -> None:
        self.clock += 1
        row = SessionRow(
            s.sid,
            s.pseudonym,
            s.subject,
            s.version,
            s.generation,
            int(s.resumable),
            s.created_at,
            s.last_seen,
            self.clock,
            s.log_level,
            s.gets,
        )
        self._batch.ops.append((_INSERT_SESSION, row))

    def session_touched(self, s: Session) -> None:
        self.clock += 1
        self._batch.touches[s.sid] = (s.last_seen, self.clock)

    def session_alive(self, s: Session, now: float) -> None:
        self._batch.alive[s.sid] = now

    def session_level(self, s: Session) -> None:
        self._batch.ops.append((_SESSION_LEVEL, (s.log_level, s.sid)))

    def session_gets(self, s: Session) -> None:
        self._batch.ops.append((_SESSION_GETS, (s.gets, s.sid)))

    def session_ended(self, s: Session) -> None:
        for st in s.streams.values():
            self.stream_forgotten(st)
        self._batch.ops.extend((sql, (s.sid,)) for sql in _END_SESSION)

    def adopt(self, st: Stream, no: int) -> None:
        """`st` is the restored stream the store numbers `no`."""
        self._numbers[st] = no

    def stream_opened(self, st: Stream) -> None:
        s = st.session
        ops = self._batch.ops
        if st.opened_by == "GET":
            ops.append((_SESSION_GETS, (s.gets, s.sid)))
        rid = request_id_text(st.request_id)
        if rid is not None:
            ops.append((_INSERT_REQUEST_ID, (s.sid, rid)))
        no = self._numbers[st] = self._next_number
        self._next_number += 1
        row = StreamRow(
            no,
            s.sid,
            st.stream_id,
            st.opened_by,
            rid,
            int(st.resumable),
            st.generation,
            st.opened_at,
            st.next_seq,
            int(st.complete),
            st.closed_at,
            st.close_reason,
            st.close_after,
            st.retry_ms,
            st.last_acked,
            st.first_seq,
        )
        ops.append((_INSERT_STREAM, row))

    def stream_polling(self, st: Stream) -> None:
        no = self._numbers.get(st)
        if no is not None:
            self._batch.ops.append((_STREAM_POLLING, (st.close_after, st.retry_ms, no)))

    def stream_closed(self, st: Stream) -> None:
        no = self._numbers.get(st)
        if no is not None:
            self._batch.ops.append((_STREAM_CLOSE, (int(st.complete), st.closed_at, st.close_reason, no)))

    def stream_acked(self, st: Stream) -> None:
        no = self._numbers.get(st)
        if no is not None:
            self._batch.ops.append((_STREAM_ACK, (st.last_acked, no)))

    def stream_trimmed(self, st: Stream) -> None:
        no = self._numbers.get(st)
        if no is not None:
            self._batch.trims[no] = st.first_seq

    def stream_forgotten(self, st: Stream) -> None:
        no = self._numbers.pop(st, None)
        if no is not None:
            self._batch.ops.extend((sql, (no,)) for sql in _FORGET_STREAM)

    def event(self, st: Stream, ev: StoredEvent) -> None:
        no = self._numbers.get(st)
        if no is not None:  # not a stream of its own (the defect shared-event-store's stand-in)
            self._batch.events.append(
                (no, ev.seq, ev.order, ev.event_id, ev.wire, ev.digest, ev.kind, ev.jsonrpc_id)
            )

    # -- hand-over ---------------------------------------------------------------------

    def handoff(self) -> None:
        """Hand what was recorded since the last call to the writer (between loop steps)."""
        batch = self._batch
        if not batch:
            return
        self._batch = _Batch()
        if self.failure is not None or self._thread is None:
            self.rows_lost += len(batch.events) + len(batch.ops) + len(batch.touches) + len(batch.trims)
            return
        self._ready.append(batch)
        self._handed += 1
        self._wake.set()

    async def run_handoffs(self) -> None:
        """The event loop's task: a hand-over every BATCH_S (and a mark when idle)."""
        while True:
            await asyncio.sleep(BATCH_S)
            now = time.time()
            if self._batch:
                self._marked_at = now  # the writer marks `saved_at` with every commit
            elif now - self._marked_at >= IDLE_MARK_S:
                self._marked_at = now
                self.meta({"saved_at": repr(now)})
            self.handoff()

    def sync(self, timeout: float = 30.0) -> None:
        """Hand over and wait until everything recorded so far is committed (StoreFailed
        if the writer failed)."""
        self.handoff()
        target = self._handed
        with self._done:
            self._done.wait_for(lambda: self._committed >= target or self.failure is not None, timeout)
        if self.failure is not None:
            raise self._failed()

    def close(self, now: float) -> None:
        """Flush everything, mark the store cleanly closed (at `now`), stop the writer.
        Idempotent; a store never started is left as it was found."""
        if self._thread is None:
            return
        self.meta({"clean": "1", "stopped_at": repr(now), "saved_at": repr(now)})
        self.handoff()
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._thread = None
        if self.failure is not None and self._ready:
            self.rows_lost += len(self._ready)
            self._ready.clear()

    def _failed(self) -> StoreFailed:
        e = StoreFailed(f"the store writer failed: {self.failure!r}")
        e.__cause__ = self.failure
        return e

    # -- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            db = self._connect()
            while True:
                self._wake.wait(0.5)
                self._wake.clear()
                ready = self._ready
                batches = [ready.popleft() for _ in range(len(ready))]
                if batches:
                    self._commit(db, batches)
                    with self._done:
                        self._committed += len(batches)
                        self._done.notify_all()
                if self._stopping and not self._ready:
                    break
            db.close()
        except BaseException as e:  # the writer must never die silently, whatever the cause
            self._fail(e)

    def _commit(self, db: sqlite3.Connection, batches: list[_Batch]) -> None:
        rows = 0
        last_order: int | None = None
        with db:
            for b in batches:
                # Events first: a session ended or a stream forgotten later in the same
                # hand-over then takes its events with it.
                if b.events:
                    db.executemany(_INSERT_CHUNK, _chunks(b.events))
                    last_order = b.events[-1][2]
                for sql, params in group_in_order(b.ops):
                    db.executemany(sql, params)
                if b.events:
                    next_seq = {r[0]: r[1] + 1 for r in b.events}
                    db.executemany(_NEXT_SEQ, [(n, no) for no, n in next_seq.items()])
                if b.touches:
                    db.executemany(_TOUCH, [(t, c, sid) for sid, (t, c) in b.touches.items()])
                if b.alive:
                    db.executemany(_ALIVE, [(t, sid) for sid, t in b.alive.items()])
                if b.trims:
                    trims = [(first, no) for no, first in b.trims.items()]
                    for sql in _TRIM:
                        db.executemany(sql, trims)
                rows += len(b.events) + len(b.ops) + len(b.touches) + len(b.alive) + len(b.trims)
            marks = [("saved_at", repr(time.time()))]
            if last_order is not None:
                marks.append(("emitted", str(last_order)))
            db.executemany(_META, marks)
        self.rows_written += rows

    def _fail(self, error: BaseException) -> None:
        with self._done:
            self.failure = error
            self._done.notify_all()
        log.error("store writer failed, nothing more is kept for a restart: %r", error)
        self.rows_lost += len(self._ready)
        self._ready.clear()


def read(path: str | Path) -> Snapshot:
    """What the store at `path` holds, read only (a running server's store, too)."""
    with closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as db:
        return _load(db)


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    """ValueError unless `db` is empty or a store of this schema."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return
    row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone() if "meta" in tables else None
    if row is None or row[0] != SCHEMA:
        found = "no schema" if row is None else f"schema {row[0]!r}"
        raise ValueError(f"{path}: not a server store ({found}, expected {SCHEMA})")


def _load(db: sqlite3.Connection) -> Snapshot:
    meta = {str(k): str(v) for k, v in db.execute("SELECT name, value FROM meta")}
    sessions = [SessionRow(*r) for r in db.execute("SELECT * FROM sessions ORDER BY touched")]
    request_ids = [(str(a), str(b)) for a, b in db.execute("SELECT sid, request_id FROM request_ids")]
    streams = [StreamRow(*r) for r in db.execute("SELECT * FROM streams ORDER BY no")]
    first = {r.no: r.first_seq for r in streams}
    try:
        events = [
            EventRow(stream, *ev)
            for stream, packed in db.execute("SELECT stream, packed FROM events ORDER BY rowid")
            for ev in marshal.loads(packed)
            if ev[0] >= first.get(stream, 0)
        ]
    except ValueError as e:  # marshal's "bad marshal data"
        raise EOFError(f"a damaged chunk of events ({e})") from None
    events.sort(key=lambda e: e.ord)
    return Snapshot(meta, sessions, request_ids, streams, events)


def _chunks(events: list[tuple[Any, ...]]) -> list[tuple[int, int, int, bytes]]:
    """A hand-over's events as chunk rows: (stream, first seq, last seq, the events packed)."""
    per: dict[int, list[tuple[Any, ...]]] = {}
    for r in events:
        per.setdefault(r[0], []).append(r[1:])
    return [(no, evs[0][0], evs[-1][0], marshal.dumps(evs)) for no, evs in per.items()]
