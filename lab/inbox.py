"""The durable inbox/outbox of the lab's clients: SQLite in WAL mode.

One file per worker process holds every client of that process (rows carry the client
ID). `accept_stream_event` calls `commit`, which writes the inbox receipt, the stream's
watermark and the business dispatch in **one transaction**: after a crash either all of
them are there or none is, so "received but never dispatched" and "dispatched but not
received" cannot happen. The business layer reads the inbox only (`receipts`).

Durability: WAL with `synchronous=NORMAL` — a committed transaction survives the death of
the process (the WAL is in the OS page cache); only a power loss may roll back the last
transactions, and then receipt and dispatch roll back together.

Tables (times are Unix epoch seconds; digests are SHA-256 hex of the event's data):

inbox       one row per accepted event, in order of acceptance (rowid)
  client_id, session_generation, stream_key, event_id, message_digest  the dedup key (unique)
  sequence          per-stream sequence decoded from an e1 event ID, NULL for opaque IDs
  server_stream_id  the server's stream ID decoded from the event ID, NULL if unknown
  kind              priming | request | notification | response | error
  jsonrpc_id        the message's JSON-RPC id (as text), NULL for notifications
  method            the message's method, NULL for responses
  conn_id           the client's connection number that delivered it
  accepted_at       when it was accepted
  data              the event's data (the message)
outbox      one row per business dispatch, unique per (client_id, dispatch_key)
  dispatch_key      `op:<operation>` for responses, `ev:<gen>:<stream>:<event>` otherwise
  session_generation, stream_key, event_id, message_digest  the receipt it came from
  kind, created_at
watermarks  last accepted event ID per (client_id, session_generation, stream_key)
  event_id, sequence, updated_at
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

from lab.client import (
    DedupKey,
    InboxReceipt,
    OutboxDispatch,
    SeenEvent,
    Watermark,
)
from lab.wire.client_ledger import LEDGER_SCHEMA, RECORD_TYPES, Record

SCHEMA_VERSION = 1
log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    client_id TEXT NOT NULL, session_generation INTEGER NOT NULL, stream_key TEXT NOT NULL,
    event_id TEXT NOT NULL, message_digest TEXT NOT NULL,
    sequence INTEGER, server_stream_id TEXT, kind TEXT NOT NULL, jsonrpc_id TEXT, method TEXT,
    conn_id INTEGER NOT NULL, accepted_at REAL NOT NULL, data TEXT NOT NULL,
    UNIQUE (client_id, session_generation, stream_key, event_id, message_digest)
);
CREATE UNIQUE INDEX IF NOT EXISTS inbox_event_once
    ON inbox (client_id, session_generation, event_id) WHERE event_id NOT LIKE '~%';
CREATE TABLE IF NOT EXISTS outbox (
    client_id TEXT NOT NULL, dispatch_key TEXT NOT NULL,
    session_generation INTEGER NOT NULL, stream_key TEXT NOT NULL, event_id TEXT NOT NULL,
    message_digest TEXT NOT NULL, kind TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (client_id, dispatch_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS watermarks (
    client_id TEXT NOT NULL, session_generation INTEGER NOT NULL, stream_key TEXT NOT NULL,
    event_id TEXT NOT NULL, sequence INTEGER, updated_at REAL NOT NULL,
    PRIMARY KEY (client_id, session_generation, stream_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def connect(path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) an inbox database with the lab's settings."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=5000")
    db.executescript(_SCHEMA)
    db.execute(
        "INSERT OR IGNORE INTO meta(name, value) VALUES ('schema', ?)",
        (f"lab.inbox.v{SCHEMA_VERSION}",),
    )
    return db


@dataclass(slots=True)
class _ClientIndex:
    """One client's receipts as `accept_stream_event` reads them: what the file holds."""

    keys: set[tuple[int, str, str, str]] = field(default_factory=set)
    seen: dict[tuple[int, str], SeenEvent] = field(default_factory=dict)
    marks: dict[tuple[int, str], Watermark] = field(default_factory=dict)
    dispatched: set[str] = field(default_factory=set)

    @classmethod
    def load(cls, db: sqlite3.Connection, client_id: str) -> _ClientIndex:
        out = cls()
        rows = db.execute(
            "SELECT session_generation, stream_key, event_id, message_digest FROM inbox"
            " WHERE client_id=? ORDER BY rowid",
            (client_id,),
        )
        for gen, stream_key, event_id, digest in rows:
            out.keys.add((gen, stream_key, event_id, digest))
            if not event_id.startswith("~"):
                out.seen.setdefault((gen, event_id), SeenEvent(stream_key, digest))
        marks = db.execute(
            "SELECT session_generation, stream_key, event_id, sequence FROM watermarks WHERE client_id=?",
            (client_id,),
        )
        out.marks = {(g, k): Watermark(e, q) for g, k, e, q in marks}
        outbox = db.execute("SELECT dispatch_key FROM outbox WHERE client_id=?", (client_id,))
        out.dispatched = {k for (k,) in outbox}
        return out

    def add(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        k = receipt.key
        self.keys.add((k.session_generation, k.stream_key, k.event_id, k.message_digest))
        if not k.event_id.startswith("~"):
            self.seen.setdefault(
                (k.session_generation, k.event_id), SeenEvent(k.stream_key, k.message_digest)
            )
            self.marks[(k.session_generation, k.stream_key)] = Watermark(k.event_id, receipt.sequence)
        if dispatch is not None:
            self.dispatched.add(dispatch.dispatch_key)


class SqliteInbox:
    """The `InboxStore` of one client, on a shared connection.

    `between_writes` is a test seam: called inside the transaction after the receipt is
    written and before the dispatch, so a test can kill the process exactly there.
    """

    def __init__(
        self,
        db: sqlite3.Connection,
        client_id: str,
        *,
        between_writes: Callable[[], None] | None = None,
        group: InboxDatabase | None = None,
    ) -> None:
        self._db = db
        self.client_id = client_id
        self._between_writes = between_writes
        self._group = group
        self._memory: _ClientIndex | None = None
        if group is not None:
            group.members.append(self)

    @classmethod
    def open(cls, path: str | Path, client_id: str) -> SqliteInbox:
        return cls(connect(path), client_id)

    # The four reads of `accept_stream_event` come from this client's index in memory,
    # loaded from the file on first use and kept in step with every commit: the file is
    # the durable write, never read per event (four SELECTs per event cost ~17 % of the
    # inbox's CPU per event, bench/bench_inbox.py).

    def _index(self) -> _ClientIndex:
        if self._memory is None:
            self._memory = _ClientIndex.load(self._db, self.client_id)
        return self._memory

    def forget_index(self) -> None:
        """Drop the index (a batch that failed to commit): the next read reloads the file."""
        self._memory = None

    def has(self, key: DedupKey) -> bool:
        return (
            key.session_generation,
            key.stream_key,
            key.event_id,
            key.message_digest,
        ) in self._index().keys

    def seen(self, session_generation: int, event_id: str) -> SeenEvent | None:
        return self._index().seen.get((session_generation, event_id))

    def watermark(self, session_generation: int, stream_key: str) -> Watermark | None:
        return self._index().marks.get((session_generation, stream_key))

    def dispatched(self, dispatch_key: str) -> bool:
        return dispatch_key in self._index().dispatched

    def commit(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        """Receipt, watermark and dispatch, all or nothing.

        Alone: one transaction per call. In an `InboxDatabase` (group commit): a savepoint
        inside the database's open transaction, committed with its batch — after a crash
        a whole batch is gone or there, and in it every receipt goes with its dispatch.
        """
        k = receipt.key
        db = self._db
        if self._group is not None:
            self._group.begin()
            db.execute("SAVEPOINT accept")
        else:
            db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT INTO inbox VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    self.client_id,
                    k.session_generation,
                    k.stream_key,
                    k.event_id,
                    k.message_digest,
                    receipt.sequence,
                    receipt.server_stream_id,
                    receipt.kind,
                    receipt.jsonrpc_id,
                    receipt.method,
                    receipt.conn_id,
                    receipt.accepted_at,
                    receipt.data,
                ),
            )
            if not k.event_id.startswith("~"):
                db.execute(
                    "INSERT OR REPLACE INTO watermarks VALUES (?,?,?,?,?,?)",
                    (
                        self.client_id,
                        k.session_generation,
                        k.stream_key,
                        k.event_id,
                        receipt.sequence,
                        receipt.accepted_at,
                    ),
                )
            if self._between_writes is not None:
                self._between_writes()
            if dispatch is not None:
                d = dispatch.key
                db.execute(
                    "INSERT INTO outbox VALUES (?,?,?,?,?,?,?,?)",
                    (
                        self.client_id,
                        dispatch.dispatch_key,
                        d.session_generation,
                        d.stream_key,
                        d.event_id,
                        d.message_digest,
                        dispatch.kind,
                        dispatch.created_at,
                    ),
                )
        except BaseException:
            if self._group is not None:
                db.execute("ROLLBACK TO accept")
                db.execute("RELEASE accept")
            else:
                db.execute("ROLLBACK")
            raise
        db.execute("RELEASE accept" if self._group is not None else "COMMIT")
        self._index().add(receipt, dispatch)
        if self._group is not None and receipt.kind != "priming":
            self._group.commits += 1

    def receipts(self, since_accepted_at: float = 0.0) -> Iterator[InboxReceipt]:
        """What the business layer reads: accepted events of this client, in order."""
        rows = self._db.execute(
            "SELECT session_generation, stream_key, event_id, message_digest, sequence, server_stream_id,"
            " kind, jsonrpc_id, method, conn_id, accepted_at, data FROM inbox"
            " WHERE client_id=? AND accepted_at>=? ORDER BY rowid",
            (self.client_id, since_accepted_at),
        )
        for r in rows:
            yield InboxReceipt(
                client_id=self.client_id,
                key=DedupKey(r[0], r[1], r[2], r[3]),
                sequence=r[4],
                server_stream_id=r[5],
                kind=r[6],
                jsonrpc_id=r[7],
                method=r[8],
                conn_id=r[9],
                accepted_at=r[10],
                data=r[11],
            )


def _sql_type(annotation: object) -> str:
    text = str(annotation)
    if "float" in text:
        return "REAL"
    if "int" in text or "bool" in text:
        return "INTEGER"
    return "TEXT"


class InboxDatabase:
    """One worker process's file: the inbox/outbox of all its clients and their client
    ledger (`mcpClientLedger.v1`, the tables of `lab.wire.client_ledger`), group-committed.

    Everything goes into one open transaction that `flush()` commits (the worker calls it
    every ~200 ms and at exit). A crash loses at most the last batch, whole: receipts with
    their dispatches and watermarks, so the server replays those events on resumption.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = connect(self.path)
        self._in_tx = False
        self.closed = False
        self.commits = 0
        """Messages accepted through this file (priming events not counted), for progress."""
        self.members: list[SqliteInbox] = []
        """The clients' inboxes in this file, whose indexes a failed batch makes stale."""
        self._inserts: dict[type[Any], str] = {}
        for rtype in RECORD_TYPES:
            cols = [f.name for f in fields(rtype)]
            types = {f.name: _sql_type(f.type) for f in fields(rtype)}
            ddl = ", ".join(f"{c} {types[c]}" for c in cols)
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {rtype.table} ({ddl})")
            self._inserts[rtype] = (
                f"INSERT INTO {rtype.table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            )
        self.db.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('ledger', ?)", (LEDGER_SCHEMA,))

    def inbox(self, client_id: str) -> SqliteInbox:
        return SqliteInbox(self.db, client_id, group=self)

    def begin(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN IMMEDIATE")
            self._in_tx = True

    def record(self, records: Iterable[Record]) -> None:
        if self.closed:
            # Every client is stopped before the file closes, so nothing should come now:
            # say so loudly rather than lose it silently.
            log.error(
                "%s: %d ledger records after close were not written", self.path, sum(1 for _ in records)
            )
            return
        for r in records:
            self.begin()
            self.db.execute(self._inserts[type(r)], astuple(r))

    def flush(self) -> None:
        if self._in_tx:
            try:
                self.db.execute("COMMIT")
            except BaseException:
                # The batch is gone from the file: so it must be from what the clients read.
                for member in self.members:
                    member.forget_index()
                raise
            self._in_tx = False

    def close(self) -> None:
        """Commit the last batch and close the file (closed even if the commit fails)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            self.db.close()
