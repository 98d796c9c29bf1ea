"""The durable inbox/outbox of the lab's clients: SQLite in WAL mode.

One file per worker process holds every client of that process (rows carry the client
ID). `accept_stream_event` calls `commit`, which writes the inbox receipt, the stream's
watermark and the business dispatch in **one transaction**: after a crash either all of
them are there or none is, so "received but never dispatched" and "dispatched but not
received" cannot happen. The business layer reads the inbox only (`receipts`).

Durability: WAL with `synchronous=NORMAL` — a committed transaction survives the death of
the process (the WAL is in the OS page cache); only a power loss may roll back the last
transactions, and then receipt and dispatch roll back together.

Uniqueness (the dedup key; one receipt per event ID and session generation; one dispatch
per dispatch key) is enforced by each client's index in memory, checked before every
commit, which refuses with the `sqlite3.IntegrityError` the file's constraints would give.
The file has no unique indexes: they were three of the four B-tree inserts of every event
(48 -> 11 µs of CPU per event for the writes, bench/bench_inbox.py), and the index is what
every read of `accept_stream_event` uses anyway. A client's index is loaded from the file
when it first reads (a reopened file), with one scan by client ID; a client the file has
never held starts empty without one.

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
outbox      one row per business dispatch, one per (client_id, dispatch_key)
  dispatch_key      `op:<operation>` for responses, `ev:<gen>:<stream>:<event>` otherwise
  session_generation, stream_key, event_id, message_digest  the receipt it came from
  kind, created_at
watermarks  last accepted event ID per (client_id, session_generation, stream_key)
  event_id, sequence, updated_at
"""

from __future__ import annotations

import logging
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from operator import attrgetter
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
    conn_id INTEGER NOT NULL, accepted_at REAL NOT NULL, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    client_id TEXT NOT NULL, dispatch_key TEXT NOT NULL,
    session_generation INTEGER NOT NULL, stream_key TEXT NOT NULL, event_id TEXT NOT NULL,
    message_digest TEXT NOT NULL, kind TEXT NOT NULL, created_at REAL NOT NULL
);
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

    def refuse_duplicates(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        """Raise what a unique constraint would, if the receipt or the dispatch is one the
        client holds already (see the module docstring: the file has no unique indexes)."""
        k = receipt.key
        if (k.session_generation, k.stream_key, k.event_id, k.message_digest) in self.keys:
            raise sqlite3.IntegrityError(
                "UNIQUE constraint failed: inbox.client_id, inbox.session_generation, inbox.stream_key,"
                " inbox.event_id, inbox.message_digest"
            )
        if not k.event_id.startswith("~") and (k.session_generation, k.event_id) in self.seen:
            raise sqlite3.IntegrityError(
                "UNIQUE constraint failed: inbox.client_id, inbox.session_generation, inbox.event_id"
            )
        if dispatch is not None and dispatch.dispatch_key in self.dispatched:
            raise sqlite3.IntegrityError("UNIQUE constraint failed: outbox.client_id, outbox.dispatch_key")

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


_INSERT_INBOX = "INSERT INTO inbox VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
_UPSERT_WATERMARK = "INSERT OR REPLACE INTO watermarks VALUES (?,?,?,?,?,?)"
_INSERT_OUTBOX = "INSERT INTO outbox VALUES (?,?,?,?,?,?,?,?)"

type _Row = tuple[Any, ...]


def _inbox_row(client_id: str, receipt: InboxReceipt) -> _Row:
    k = receipt.key
    return (
        client_id,
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
    )


def _watermark_row(client_id: str, receipt: InboxReceipt) -> _Row:
    k = receipt.key
    return (client_id, k.session_generation, k.stream_key, k.event_id, receipt.sequence, receipt.accepted_at)


def _outbox_row(client_id: str, dispatch: OutboxDispatch) -> _Row:
    d = dispatch.key
    return (
        client_id,
        dispatch.dispatch_key,
        d.session_generation,
        d.stream_key,
        d.event_id,
        d.message_digest,
        dispatch.kind,
        dispatch.created_at,
    )


class SqliteInbox:
    """The `InboxStore` of one client, on a shared connection.

    `between_writes` is a test seam: called inside the transaction after the receipt is
    written and before the dispatch, so a test can kill the process exactly there (in a
    group, before any row of the event joins the batch).
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
            group = self._group
            if group is not None and self.client_id not in group.clients_in_file:
                self._memory = _ClientIndex()  # nothing of this client in the file to load
                return self._memory
            if group is not None and self.client_id in group.pending_clients:
                group.write_pending()  # the file must hold this client's batched rows
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

        Alone: one transaction per call. In an `InboxDatabase` (group commit): the three
        rows join the database's pending batch, written and committed together by its
        `flush()` — after a crash a whole batch is gone or there, and in it every receipt
        goes with its dispatch and watermark.
        """
        if self._group is not None:
            self._commit_to_batch(self._group, receipt, dispatch)
            return
        k = receipt.key
        index = self._index()
        index.refuse_duplicates(receipt, dispatch)
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(_INSERT_INBOX, _inbox_row(self.client_id, receipt))
            if not k.event_id.startswith("~"):
                db.execute(_UPSERT_WATERMARK, _watermark_row(self.client_id, receipt))
            if self._between_writes is not None:
                self._between_writes()
            if dispatch is not None:
                db.execute(_INSERT_OUTBOX, _outbox_row(self.client_id, dispatch))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        index.add(receipt, dispatch)

    def _commit_to_batch(
        self, group: InboxDatabase, receipt: InboxReceipt, dispatch: OutboxDispatch | None
    ) -> None:
        """Group mode: no SQL per event (a savepoint and three INSERTs per event were ~17 %
        of a worker's CPU). The rows wait in the batch, in order, for `flush()`.

        Uniqueness is checked against the client's index (which mirrors what the file and
        the batch hold), so a commit it refuses fails at once and leaves nothing in the
        batch."""
        if group.closed:
            raise sqlite3.ProgrammingError(f"{group.path}: commit after the inbox file was closed")
        k = receipt.key
        index = self._index()
        index.refuse_duplicates(receipt, dispatch)
        synthetic = k.event_id.startswith("~")
        client_id = self.client_id
        if self._between_writes is not None:
            self._between_writes()  # nothing of this event is in the batch yet: all or nothing
        pending = group.pending
        pending[_INSERT_INBOX].append(_inbox_row(client_id, receipt))
        group.clients_in_file.add(client_id)
        if not synthetic:
            pending[_UPSERT_WATERMARK].append(_watermark_row(client_id, receipt))
        if dispatch is not None:
            pending[_INSERT_OUTBOX].append(_outbox_row(client_id, dispatch))
        group.pending_clients.add(client_id)
        index.add(receipt, dispatch)
        if receipt.kind != "priming":
            group.commits += 1

    def receipts(self, since_accepted_at: float = 0.0) -> Iterator[InboxReceipt]:
        """What the business layer reads: accepted events of this client, in order
        (those still in the group's batch included: they are written, not committed, first)."""
        if self._group is not None:
            self._group.write_pending()
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

    Accepted events and ledger records wait in a batch in memory, per table in the order
    they came; `flush()` (the worker calls it every ~200 ms and at exit) writes the batch
    with one `executemany` per table and commits it, in one transaction. A crash loses at
    most the last batch, whole: receipts with their dispatches and watermarks, so the
    server replays those events on resumption. Whatever reads the file through this
    connection (`SqliteInbox.receipts`, a client's index loaded from the file) first
    writes the batch into the open transaction (`write_pending`), so it sees every row.
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
        self.pending: defaultdict[str, list[_Row]] = defaultdict(list)
        """The batch not yet in the file: rows by INSERT statement, each list in order."""
        self.pending_clients: set[str] = set()
        """Clients with rows in the batch (a client's index loaded from the file needs them)."""
        self.clients_in_file: set[str] = {
            c for (c,) in self.db.execute("SELECT client_id FROM inbox UNION SELECT client_id FROM outbox")
        }
        """Clients with receipts or dispatches in the file or the batch: only theirs are
        loaded from it (one scan when the file is opened; a new file has none)."""
        self._record_rows: dict[type[Any], tuple[str, Callable[[Any], _Row]]] = {}
        for rtype in RECORD_TYPES:
            cols = [f.name for f in fields(rtype)]
            types = {f.name: _sql_type(f.type) for f in fields(rtype)}
            ddl = ", ".join(f"{c} {types[c]}" for c in cols)
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {rtype.table} ({ddl})")
            insert = f"INSERT INTO {rtype.table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
            # The record's fields as a row, as `astuple` gives them (they are all scalars)
            # without its recursive copy: one attrgetter call per record. (Every record
            # has several fields, so the getter returns a tuple.)
            assert len(cols) > 1, rtype
            self._record_rows[rtype] = (insert, attrgetter(*cols))
        self.db.execute("INSERT OR REPLACE INTO meta(name, value) VALUES ('ledger', ?)", (LEDGER_SCHEMA,))

    def inbox(self, client_id: str) -> SqliteInbox:
        return SqliteInbox(self.db, client_id, group=self)

    def begin(self) -> None:
        """Open the batch's transaction (if it is not open yet)."""
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
        pending, rows = self.pending, self._record_rows
        for r in records:
            insert, row = rows[type(r)]
            pending[insert].append(row(r))

    def pending_rows(self) -> int:
        """Rows in the batch not yet written to the file."""
        return sum(len(rows) for rows in self.pending.values())

    def write_pending(self) -> None:
        """Write the batch into the open transaction, uncommitted: a read through this
        connection then sees it; `flush()` commits it. On failure the batch is dropped as
        by a failed `flush()` (and the error raised)."""
        if not self.pending:
            return
        try:
            self.begin()
            for insert, rows in self.pending.items():
                self.db.executemany(insert, self._rows_to_write(insert, rows))
        except BaseException:
            self._batch_failed("writing")
            raise
        self.pending.clear()
        self.pending_clients.clear()

    @staticmethod
    def _rows_to_write(insert: str, rows: list[_Row]) -> list[_Row]:
        """The rows of one statement as written: a stream's watermark only as it stands at
        the end of the batch. (A watermark row replaces the one before it, so the file
        ends the same; a stream delivering 20 events in a batch upserted its watermark 20
        times, bench/bench_inbox.py --burst.)"""
        if insert != _UPSERT_WATERMARK or len(rows) < 2:
            return rows
        last: dict[tuple[Any, Any, Any], _Row] = {}
        for row in rows:
            last[(row[0], row[1], row[2])] = row  # client_id, session_generation, stream_key
        return list(last.values())

    def flush(self) -> None:
        """Write and commit the batch; on failure the whole batch is gone (from the file
        and from what the clients read) and the error is raised."""
        self.write_pending()
        if self._in_tx:
            try:
                self.db.execute("COMMIT")
            except BaseException:
                self._batch_failed("committing")
                raise
            self._in_tx = False

    def _batch_failed(self, doing: str) -> None:
        """The batch is gone from the file: so it must be from what the clients read (their
        indexes reload from the file), and its rows are dropped, loudly: the events come
        again on resumption, since no watermark of theirs was kept."""
        lost = self.pending_rows()
        self.pending.clear()
        self.pending_clients.clear()
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("%s: rolling back the failed batch failed", self.path)
        self._in_tx = False
        for member in self.members:
            member.forget_index()
        log.error(
            "%s: %s the batch failed; the batch is lost (%d rows not yet written)", self.path, doing, lost
        )

    def close(self) -> None:
        """Commit the last batch and close the file (closed even if the commit fails)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            self.db.close()
