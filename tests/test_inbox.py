"""The durable inbox/outbox: same semantics as the in-memory store, survives restarts,
and a crash can never leave a receipt without its dispatch (or the reverse)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import astuple
from pathlib import Path

import pytest

from lab.client import (
    ConnectionView,
    DedupKey,
    InboxReceipt,
    InboxStore,
    MemoryInbox,
    OutboxDispatch,
    Outcome,
    SeenEvent,
    SessionView,
    StreamView,
    Watermark,
    accept_stream_event,
)
from lab.inbox import InboxDatabase, SqliteInbox, connect
from lab.wire import jsonrpc
from lab.wire.client_ledger import EventRejected
from lab.wire.event_ids import EventIdCodec, post_stream_id, session_tag
from lab.wire.sse import SseEvent

ROOT = Path(__file__).resolve().parents[1]
CODEC = EventIdCodec(b"q" * 32)
TAG = session_tag("sid-for-inbox-tests-000000000000")
SESSION = SessionView(1, True, "2025-11-25", "alice", TAG, True, 0)
CONN = ConnectionView(1, 1, "2025-11-25", "alice")


def _script(store: InboxStore) -> list[Outcome]:
    """A little history: priming, progress, a replay, a response, a late duplicate."""
    out = []
    for rid in (1, 2):
        psid = post_stream_id(TAG, rid)
        stream = StreamView(f"post:{rid}", rid, rid, f"op-{rid}", psid)
        msgs = [
            "",
            jsonrpc.dumps(jsonrpc.notification(jsonrpc.PROGRESS, {"progressToken": rid, "progress": 1})),
            jsonrpc.dumps(jsonrpc.result(rid, {"ok": True})),
        ]
        ids = [CODEC.mint(TAG, 0, psid, i, m) for i, m in enumerate(msgs)]
        for i in (0, 1, 1, 2, 2):
            a = accept_stream_event(
                store,
                client_id="c1",
                session=SESSION,
                conn=CONN,
                stream=stream,
                event=SseEvent(data=msgs[i], id=ids[i]),
                event_id=ids[i],
                now=100.0 + i,
            )
            out.append(a.outcome)
    return out


def test_sqlite_and_memory_stores_agree(tmp_path: Path) -> None:
    mem = MemoryInbox()
    sql = SqliteInbox.open(tmp_path / "inbox.sqlite", "c1")
    assert _script(mem) == _script(sql)
    assert [r for r in sql.receipts()] == mem.receipts
    db = sqlite3.connect(tmp_path / "inbox.sqlite")
    assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == len(mem.dispatches) == 4


def test_watermark_and_dedup_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    first = SqliteInbox.open(path, "c1")
    _script(first)
    wm = first.watermark(1, "post:1")
    del first
    reopened = SqliteInbox.open(path, "c1")
    assert reopened.watermark(1, "post:1") == wm and wm is not None and wm.sequence == 2
    # Replaying the whole history into the reopened inbox accepts nothing new.
    assert set(_script(reopened)) == {Outcome.DUPLICATE}


def test_clients_sharing_a_file_are_kept_apart(tmp_path: Path) -> None:
    db = connect(tmp_path / "inbox.sqlite")
    a, b = SqliteInbox(db, "a"), SqliteInbox(db, "b")
    _script(a)
    assert b.watermark(1, "post:1") is None
    assert _script(b) == _script(MemoryInbox())


def _check_atomic(path: Path) -> tuple[int, int]:
    db = sqlite3.connect(path)
    receipts = {r[0] for r in db.execute("SELECT event_id FROM inbox WHERE kind != 'priming'")}
    dispatches = {r[0] for r in db.execute("SELECT event_id FROM outbox")}
    watermarks = {r[0] for r in db.execute("SELECT event_id FROM watermarks")}
    assert receipts == dispatches, "a receipt without its dispatch, or the reverse"
    assert watermarks <= receipts
    return len(receipts), len(dispatches)


def _kill_mid_commit(path: Path, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.inbox_writer", str(path), "50", "20", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_kill_between_receipt_and_dispatch_loses_both(tmp_path: Path) -> None:
    path = tmp_path / "inbox.sqlite"
    _kill_mid_commit(path)
    receipts, _ = _check_atomic(path)
    assert receipts == 20  # commits 0..19 are there, the 20th vanished whole


def test_the_pairing_check_catches_a_split_commit(tmp_path: Path) -> None:
    # The same kill, with receipt and dispatch in two transactions: a receipt is left
    # without its dispatch, and the check above says so.
    path = tmp_path / "inbox.sqlite"
    _kill_mid_commit(path, "split")
    with pytest.raises(AssertionError, match="without its dispatch"):
        _check_atomic(path)


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.3])
def test_kill_at_a_random_moment_keeps_receipts_and_dispatches_paired(tmp_path: Path, delay: float) -> None:
    path = tmp_path / "inbox.sqlite"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.inbox_writer", str(path), "1000000"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    receipts, _ = _check_atomic(path)
    assert receipts > 0


# -- the reads come from each client's index in memory, kept in step with the file ------


def _receipt(client_id: str, event_id: str) -> tuple[DedupKey, InboxReceipt, OutboxDispatch]:
    key = DedupKey(1, "get:1", event_id, "d" * 64)
    now = time.time()
    receipt = InboxReceipt(client_id, key, 1, None, "notification", None, "m", 1, now, "{}")
    return key, receipt, OutboxDispatch(client_id, f"ev:{event_id}", key, "notification", now)


class _CommitFails:
    """A connection whose COMMIT fails the way a full disk makes it: the batch is gone."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def execute(self, sql: str, params: tuple[object, ...] = ()) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self.db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, params)

    def __getattr__(self, name: str) -> object:
        return getattr(self.db, name)  # executemany, in_transaction: the real connection's


def test_a_reopened_inbox_reads_what_the_file_holds(tmp_path: Path) -> None:
    db = InboxDatabase(tmp_path / "w.sqlite")
    key, receipt, dispatch = _receipt("c1", "e1")
    db.inbox("c1").commit(receipt, dispatch)
    db.flush()
    again = SqliteInbox(db.db, "c1")
    assert again.has(key) and again.dispatched("ev:e1")
    assert again.seen(1, "e1") == SeenEvent("get:1", "d" * 64)
    assert again.watermark(1, "get:1") == Watermark("e1", 1)
    assert not SqliteInbox(db.db, "c2").has(key)  # another client's index is its own
    db.close()


def test_a_batch_that_fails_to_commit_is_gone_from_what_the_clients_read(tmp_path: Path) -> None:
    db = InboxDatabase(tmp_path / "w.sqlite")
    inbox = db.inbox("c1")
    key, receipt, dispatch = _receipt("c1", "e1")
    inbox.commit(receipt, dispatch)
    assert inbox.has(key)
    db.db = _CommitFails(db.db)  # type: ignore[assignment]
    with pytest.raises(sqlite3.OperationalError):
        db.flush()
    # The file lost the batch: a redelivery of e1 must be accepted again, not dropped.
    assert not inbox.has(key) and not inbox.dispatched("ev:e1") and inbox.watermark(1, "get:1") is None


# -- group commit: the batch waits in memory and is written whole at flush ---------------


def test_a_kill_before_the_flush_loses_the_batch_whole(tmp_path: Path) -> None:
    # Group mode, flushed every 7 commits, killed at the 21st: the batches 0..6 and 7..13
    # are in the file, the pending one (14..19) is gone: receipts with their dispatches.
    path = tmp_path / "inbox.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.helpers.inbox_writer", str(path), "50", "20", "group"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    receipts, dispatches = _check_atomic(path)
    assert receipts == dispatches == 14
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM watermarks").fetchone()[0] == 14


def test_a_read_mid_batch_sees_the_pending_rows_uncommitted(tmp_path: Path) -> None:
    path = tmp_path / "w.sqlite"
    db = InboxDatabase(path)
    inbox = db.inbox("c1")
    _, receipt, dispatch = _receipt("c1", "e1")
    inbox.commit(receipt, dispatch)
    assert db.pending_rows() == 3  # receipt, watermark, dispatch: nothing written yet
    assert list(inbox.receipts()) == [receipt]  # the read writes the batch first
    assert db.pending_rows() == 0
    # A second inbox of the same client loads its index from the file: the batch is in it.
    _, receipt2, dispatch2 = _receipt("c1", "e2")
    inbox.commit(receipt2, dispatch2)
    again = SqliteInbox(db.db, "c1", group=db)
    assert again.has(receipt2.key) and again.dispatched("ev:e2")
    # Written is not committed: another connection sees nothing until the flush.
    other = sqlite3.connect(path)
    assert other.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 0
    db.flush()
    assert other.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 2
    assert other.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 2
    db.close()


def test_a_batch_the_disk_cannot_take_is_lost_whole_and_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real full disk: the file may not grow by a page (PRAGMA max_page_count).
    path = tmp_path / "w.sqlite"
    db = InboxDatabase(path)
    inbox = db.inbox("c1")
    key, receipt, dispatch = _receipt("c1", "e0")
    inbox.commit(receipt, dispatch)
    db.flush()
    pages = db.db.execute("PRAGMA page_count").fetchone()[0]
    db.db.execute(f"PRAGMA max_page_count={pages}")
    big = []
    for i in range(1, 40):
        k, r, d = _receipt("c1", f"e{i}")
        r = InboxReceipt(r.client_id, k, i, None, "notification", None, "m", 1, r.accepted_at, "x" * 4000)
        inbox.commit(r, d)
        big.append(k)
    db.record([EventRejected("c1", 1, 1, "get:1", "e99", "d" * 64, "duplicate", "", 1.0)])
    with pytest.raises(sqlite3.OperationalError, match="full"):
        db.flush()
    assert "the batch is lost" in caplog.text
    assert db.pending_rows() == 0 and not db.db.in_transaction
    # What the client reads is what the file holds: e0, and none of the lost batch.
    assert inbox.has(key) and not any(inbox.has(k) for k in big) and not inbox.dispatched("ev:e1")
    other = sqlite3.connect(path)
    assert other.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 1
    assert other.execute("SELECT COUNT(*) FROM events_rejected").fetchone()[0] == 0
    # Room again: the next batch is written (the lost events come again on resumption).
    db.db.execute("PRAGMA max_page_count=1073741823")
    _, r1, d1 = _receipt("c1", "e1")
    inbox.commit(r1, d1)
    db.close()
    assert other.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 2


def test_a_commit_the_file_would_refuse_fails_at_once_and_leaves_the_batch_alone(tmp_path: Path) -> None:
    db = InboxDatabase(tmp_path / "w.sqlite")
    inbox = db.inbox("c1")
    _, receipt, dispatch = _receipt("c1", "e1")
    inbox.commit(receipt, dispatch)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        inbox.commit(receipt, None)  # the same dedup key again
    _, other, _ = _receipt("c1", "e2")
    with pytest.raises(sqlite3.IntegrityError, match="outbox"):
        inbox.commit(other, OutboxDispatch("c1", "ev:e1", other.key, "notification", 1.0))
    assert db.pending_rows() == 3
    db.close()
    file = sqlite3.connect(tmp_path / "w.sqlite")
    assert file.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 1


def test_ledger_records_are_written_as_their_fields(tmp_path: Path) -> None:
    db = InboxDatabase(tmp_path / "w.sqlite")
    rec = EventRejected("c1", 3, 2, "post:1", "e9", "d" * 64, "cursor_gap", "skips", 12.5)
    db.record([rec, rec])
    db.close()
    rows = sqlite3.connect(tmp_path / "w.sqlite").execute("SELECT * FROM events_rejected").fetchall()
    assert rows == [astuple(rec), astuple(rec)]


def test_a_commit_alone_refuses_a_duplicate_after_a_restart(tmp_path: Path) -> None:
    """The file has no unique indexes: a client's index, loaded from the file when it is
    reopened, refuses what the constraints would have (and writes nothing)."""
    path = tmp_path / "inbox.sqlite"
    _, receipt, dispatch = _receipt("c1", "e1")
    SqliteInbox.open(path, "c1").commit(receipt, dispatch)
    reopened = SqliteInbox.open(path, "c1")
    with pytest.raises(sqlite3.IntegrityError, match=r"inbox\.event_id"):
        reopened.commit(receipt, None)
    _, other, _ = _receipt("c1", "e2")
    with pytest.raises(sqlite3.IntegrityError, match="outbox"):
        reopened.commit(other, dispatch)
    file = sqlite3.connect(path)
    assert file.execute("SELECT COUNT(*) FROM inbox").fetchone()[0] == 1
    assert file.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1


def test_a_new_client_reads_nothing_from_the_file_and_a_known_one_its_own(tmp_path: Path) -> None:
    """A worker makes clients all run long: a client the file never held starts with an
    empty index, without scanning the file; one the file holds (a reopened file) loads it."""
    path = tmp_path / "w.sqlite"
    db = InboxDatabase(path)
    _, receipt, dispatch = _receipt("old", "e1")
    db.inbox("old").commit(receipt, dispatch)
    db.close()
    db = InboxDatabase(path)
    selects: list[str] = []
    db.db.set_trace_callback(lambda sql: selects.append(sql) if sql.startswith("SELECT") else None)
    assert not db.inbox("new").has(receipt.key)
    assert selects == []
    old = db.inbox("old")
    assert old.has(receipt.key) and old.dispatched(dispatch.dispatch_key)
    assert len(selects) == 3  # its receipts, watermarks and dispatches
    db.close()
