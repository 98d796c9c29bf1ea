"""The reference server's ledger (`mcpServerLedger.v1`, SQLite; fields in docs/ledgers.md).

Writes never block the event loop: the loop appends (sql, params) to a deque, with no
lock, and a writer thread takes what is there every ~50 ms (at once when a barrier
waits) and applies it in one transaction (executemany per statement and table, in an
order with the outcome of writing row by row: `group_in_order`). No per-row queue
handling and no per-row lock: the server writes a row per event (bench/bench_server.py
--before). Durability: WAL with synchronous=NORMAL, so a committed batch survives a
crash of the server process. Business dispatches must be durable *before*
the client is told they happened, so `barrier()` returns a future that resolves once
everything queued before it is committed; `ledger.append` awaits it before answering
(group commit: many writes share one commit).

The writer cannot die silently:
- text SQLite cannot store (a lone surrogate) is written escaped (`\\udc00`), never
  dropped: a batch that fails to encode is written again with every such string escaped;
- any other failure (disk full, I/O error, a damaged file) is fatal: `failure` is set,
  a line goes to the log, every waiting `barrier()` and every later one fails with
  `LedgerFailed`, later rows are counted in `rows_lost`, and the server exits 4.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

SCHEMA = "mcpServerLedger.v1"
log = logging.getLogger("lab.server.ledger")

_DDL = """
CREATE TABLE IF NOT EXISTS sessions (
    session TEXT PRIMARY KEY, principal TEXT, auth_subject TEXT, handshake_receipt TEXT,
    protocol_version TEXT, origin_policy TEXT, created_at REAL, expires_at REAL,
    generation INTEGER, resumable INTEGER, shadow INTEGER, ended_at REAL, end_reason TEXT
);
CREATE TABLE IF NOT EXISTS streams (
    session TEXT, stream_id TEXT, opened_by TEXT, request_id TEXT, payload_digest TEXT, conn TEXT,
    opened_at REAL, last_sent_event_id TEXT, last_acked_event_id TEXT, retry_ms INTEGER,
    closed_at REAL, close_reason TEXT, PRIMARY KEY (session, stream_id)
);
CREATE TABLE IF NOT EXISTS events_sent (
    session TEXT, stream_id TEXT, event_id TEXT, sequence INTEGER, digest TEXT, kind TEXT,
    jsonrpc_id TEXT, sent_at REAL, replay INTEGER, conn TEXT
);
CREATE TABLE IF NOT EXISTS dispatches (
    idempotency_key TEXT, session TEXT, auth_subject TEXT, request_id TEXT, tool TEXT,
    effect TEXT, receipt TEXT, at REAL, arguments_digest TEXT
);
CREATE TABLE IF NOT EXISTS requests (
    at REAL, method TEXT, conn TEXT, session TEXT, status INTEGER, reason TEXT, origin TEXT,
    origin_allowed INTEGER, protocol_version TEXT, last_event_id TEXT, cursor_verdict TEXT
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT);
"""


class LedgerFailed(Exception):
    """The ledger writer failed for good (`__cause__` says why); nothing more is recorded."""


def escape_text(value: Any) -> Any:
    """A value SQLite can store: text that is not valid Unicode gets its bad code points
    escaped (`\\udc00`); everything else is returned as it is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


class Ledger:
    """Queue in, SQLite out, on a thread of its own."""

    def __init__(self, path: str | Path | None, meta: dict[str, str] | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._pending: deque[tuple[str, Sequence[Any]]] = deque()
        """Rows (sql, params) in order. A deque: the event loop appends and the writer pops
        without a lock (each is one atomic call), and the writer takes what is there."""
        self._barriers: list[Future[None]] = []
        """Futures to resolve once every row written before them is committed: a batch
        is one transaction, so those of a batch resolve after its commit."""
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.rows_written = 0
        self.rows_escaped = 0
        self.rows_lost = 0
        self._inflight = 0
        self.failure: BaseException | None = None
        """Why the writer stopped for good; None while it works."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = self._connect()
            rows = {"schema": SCHEMA, **(meta or {})}
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(rows.items()))
            db.commit()
            db.close()
            self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
            self._thread.start()

    def _connect(self) -> sqlite3.Connection:
        assert self.path is not None
        db = sqlite3.connect(self.path, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_DDL)
        return db

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def write(self, sql: str, params: Sequence[Any]) -> None:
        if self.path is None:
            return
        if self.failure is None:
            self._pending.append((sql, params))
        else:
            self.rows_lost += 1

    def barrier(self) -> Future[None]:
        """A future that completes when everything written before it is committed, or
        fails with LedgerFailed if the writer has failed (never left hanging)."""
        fut: Future[None] = Future()
        if self.path is None:
            fut.set_result(None)
            return fut
        with self._lock:
            if self.failure is None:
                self._barriers.append(fut)
                self._wake.set()
                return fut
        fut.set_exception(self._failed())
        return fut

    def _failed(self) -> LedgerFailed:
        e = LedgerFailed(f"the ledger writer failed: {self.failure!r}")
        e.__cause__ = self.failure
        return e

    def close(self) -> None:
        """Flush everything and stop the writer (idempotent)."""
        if self._thread is not None:
            with self._lock:
                if self.failure is None:
                    self._stopping = True
                    self._wake.set()
            self._thread.join(timeout=30)
            self._thread = None
        if self.failure is not None and self._pending:
            self.rows_lost += len(self._pending)  # written as the writer failed
            self._pending.clear()

    def _run(self) -> None:
        waiters: list[Future[None]] = []
        try:
            db = self._connect()
            stop = False
            while not stop:
                self._wake.wait(0.05)
                with self._lock:  # the barriers first: every row written before them is in
                    waiters, self._barriers = self._barriers, []
                    stop = self._stopping
                    self._wake.clear()
                pending = self._pending
                writes = [pending.popleft() for _ in range(len(pending))]
                if not writes:
                    for w in waiters:
                        w.set_result(None)
                    continue
                grouped = group_in_order(writes)
                self._inflight = len(writes)
                self._commit(db, grouped)
                self._inflight = 0
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
            db.close()
        except BaseException as e:  # the writer must never die silently, whatever the cause
            self._fail(e, waiters)

    def _commit(self, db: sqlite3.Connection, grouped: list[tuple[str, list[Sequence[Any]]]]) -> None:
        try:
            with db:
                for sql, rows in grouped:
                    db.executemany(sql, rows)
        except (UnicodeEncodeError, sqlite3.ProgrammingError):
            # Text SQLite cannot take (the transaction was rolled back): write the batch
            # again with such text escaped. A second failure is a real one.
            escaped: list[tuple[str, list[tuple[Any, ...]]]] = []
            for sql, rows in grouped:
                fixed = [tuple(escape_text(v) for v in row) for row in rows]
                self.rows_escaped += sum(tuple(a) != b for a, b in zip(rows, fixed, strict=True))
                escaped.append((sql, fixed))
            with db:
                for sql, fixed in escaped:
                    db.executemany(sql, fixed)
        self.rows_written += sum(len(rows) for _, rows in grouped)

    def _fail(self, error: BaseException, waiters: list[Future[None]]) -> None:
        with self._lock:
            self.failure = error
        log.error("ledger writer failed, no further rows are recorded: %r", error)
        lost, self._inflight = self._inflight, 0  # the batch that failed was not committed
        with self._lock:
            waiters += self._barriers
            self._barriers = []
        lost += len(self._pending)  # a row racing the failure lands here too: counted at close
        self._pending.clear()
        self.rows_lost += lost
        for w in waiters:
            if not w.done():
                w.set_exception(self._failed())


_table_of: dict[str, str] = {}
"""Statement -> the table it writes (a handful of statements; matched once each)."""
_TABLE = re.compile(r"^\s*(?:INSERT(?:\s+OR\s+\w+)?\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)


def group_in_order(writes: Sequence[tuple[str, Sequence[Any]]]) -> list[tuple[str, list[Sequence[Any]]]]:
    """A batch's writes as (statement, rows) groups for executemany, in an order with the
    same outcome as writing them one by one.

    A row joins the last group of its statement only if no other statement touched the
    same table since: an UPDATE must follow the INSERT it updates, and an INSERT OR
    REPLACE must not overtake an UPDATE of its row (nor a DELETE: the store, store.py,
    groups its statements here too). Tables are independent of each other,
    so events, requests and dispatches still go in one executemany each per batch.
    (Grouping by statement alone once put a stream's close before its own insert when
    streams opened and closed within one batch, and the close was lost.)
    """
    groups: list[tuple[str, list[Sequence[Any]]]] = []
    last_of_sql: dict[str, int] = {}
    last_on_table: dict[str, int] = {}
    for sql, params in writes:
        table = _table_of.get(sql)
        if table is None:
            m = _TABLE.match(sql)
            table = _table_of[sql] = m.group(1).lower() if m else sql
        at = last_of_sql.get(sql)
        if at is not None and last_on_table.get(table) == at:
            groups[at][1].append(params)
            continue
        groups.append((sql, [params]))
        last_of_sql[sql] = last_on_table[table] = len(groups) - 1
    return groups


INSERT_SESSION = "INSERT OR REPLACE INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
END_SESSION = "UPDATE sessions SET ended_at=?, end_reason=?, expires_at=? WHERE session=?"
INSERT_STREAM = "INSERT OR REPLACE INTO streams VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
CLOSE_STREAM = (
    "UPDATE streams SET closed_at=?, close_reason=?, last_sent_event_id=?, last_acked_event_id=?, retry_ms=?"
    " WHERE session=? AND stream_id=?"
)
ACK_STREAM = "UPDATE streams SET last_acked_event_id=? WHERE session=? AND stream_id=?"
INSERT_EVENT = "INSERT INTO events_sent VALUES (?,?,?,?,?,?,?,?,?,?)"
INSERT_DISPATCH = "INSERT INTO dispatches VALUES (?,?,?,?,?,?,?,?,?)"
INSERT_REQUEST = "INSERT INTO requests VALUES (?,?,?,?,?,?,?,?,?,?,?)"
INSERT_META = "INSERT OR REPLACE INTO meta VALUES (?, ?)"


def load_receipts(path: str | Path) -> dict[tuple[str | None, str], str]:
    """Idempotency receipts already performed (so a restarted server still deduplicates)."""
    p = Path(path)
    if not p.exists():
        return {}
    db = sqlite3.connect(p)
    try:
        rows = db.execute(
            "SELECT auth_subject, idempotency_key, receipt FROM dispatches WHERE effect='performed'"
        ).fetchall()
    except sqlite3.OperationalError:
        rows = []
    finally:
        db.close()
    return {(r[0], r[1]): r[2] for r in rows}
