"""CPU per accepted event of the durable inbox: the four reads `accept_stream_event` makes
(has, seen, watermark, dispatched) and the commit, side by side in one run:

- `savepoint per event (before)`: the group commit as it was, a SAVEPOINT, two or three
  INSERTs and a RELEASE per event inside the batch's transaction (`SavepointCommit`);
- `batch at flush (lab.inbox)`: the rows wait in memory and `flush()` writes each table's
  with one executemany;
- with `--sql-reads`, also the reads from SQLite (one SELECT each per event, `SqlReads`,
  the step before the clients' indexes in memory).

    .venv/bin/python bench/bench_inbox.py [--clients 200] [--events 500] [--rounds 3] [--sql-reads]

Each round writes a fresh file per variant (one InboxDatabase, group commit every 200
events as a worker's flush does), the clients' events interleaved as on a busy worker.
Prints µs of CPU per event (process time) per variant, medians of the alternated rounds,
and the ratio of each to the first; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.client import DedupKey, InboxReceipt, OutboxDispatch, SeenEvent, Watermark
from lab.inbox import InboxDatabase, SqliteInbox


class SqlReads(SqliteInbox):
    """The reads as they were: one SELECT each, per event."""

    def has(self, key: DedupKey) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM inbox WHERE client_id=? AND session_generation=? AND stream_key=?"
            " AND event_id=? AND message_digest=?",
            (self.client_id, key.session_generation, key.stream_key, key.event_id, key.message_digest),
        ).fetchone()
        return row is not None

    def seen(self, session_generation: int, event_id: str) -> SeenEvent | None:
        row = self._db.execute(
            "SELECT stream_key, message_digest FROM inbox"
            " WHERE client_id=? AND session_generation=? AND event_id=? AND event_id NOT LIKE '~%'",
            (self.client_id, session_generation, event_id),
        ).fetchone()
        return None if row is None else SeenEvent(row[0], row[1])

    def watermark(self, session_generation: int, stream_key: str) -> Watermark | None:
        row = self._db.execute(
            "SELECT event_id, sequence FROM watermarks WHERE client_id=? AND session_generation=? AND stream_key=?",
            (self.client_id, session_generation, stream_key),
        ).fetchone()
        return None if row is None else Watermark(row[0], row[1])

    def dispatched(self, dispatch_key: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM outbox WHERE client_id=? AND dispatch_key=?", (self.client_id, dispatch_key)
        ).fetchone()
        return row is not None


class SavepointCommit(SqliteInbox):
    """The group commit as it was: each event written at once, in a savepoint of the
    batch's open transaction (which `flush()` commits)."""

    def commit(self, receipt: InboxReceipt, dispatch: OutboxDispatch | None) -> None:
        assert self._group is not None
        k = receipt.key
        db = self._db
        self._group.begin()
        db.execute("SAVEPOINT accept")
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
            db.execute("ROLLBACK TO accept")
            db.execute("RELEASE accept")
            raise
        db.execute("RELEASE accept")
        self._index().add(receipt, dispatch)
        if receipt.kind != "priming":
            self._group.commits += 1


class SqlReadsSavepoint(SqlReads, SavepointCommit):
    """Reads from SQLite and the savepoint per event: the inbox before both steps."""


class EveryWatermark(InboxDatabase):
    """The batch as it was before watermarks were coalesced: every event's watermark row
    written (each replacing the one before it)."""

    @staticmethod
    def _rows_to_write(insert: str, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return rows


def one_round(
    variant: tuple[type[SqliteInbox], type[InboxDatabase]],
    folder: Path,
    clients: int,
    events: int,
    burst: int,
) -> float:
    """µs of process CPU per accepted event."""
    kind, db_kind = variant
    db = db_kind(folder / f"{kind.__name__}-{db_kind.__name__}.sqlite")
    inboxes = [kind(db.db, f"c{i}", group=db) for i in range(clients)]
    started = time.process_time()
    n = 0
    # Each client takes `burst` events in a row (a stream's events arrive together), then the next.
    order = [(e0 + j, i) for e0 in range(0, events, burst) for i in range(clients) for j in range(burst)]
    for e, i in order:
        if e >= events:
            continue
        inbox = inboxes[i]
        event_id = f"{i}-{e}"
        digest = f"{(i * 7919 + e):064x}"
        key = DedupKey(1, "get:1", event_id, digest)
        inbox.has(key)
        inbox.seen(1, event_id)
        inbox.watermark(1, "get:1")
        inbox.dispatched(f"ev:1:get:1:{event_id}")
        now = time.time()
        cid = inbox.client_id
        receipt = InboxReceipt(
            cid, key, e, None, "notification", None, "notifications/progress", 1, now, "{}"
        )
        inbox.commit(receipt, OutboxDispatch(cid, f"ev:1:get:1:{event_id}", key, "notification", now))
        n += 1
        if n % 200 == 0:
            db.flush()
    db.close()
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--events", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sql-reads", action="store_true", help="also the reads from SQLite (SqlReads)")
    ap.add_argument("--burst", type=int, default=1, help="events each client takes in a row (1..100)")
    args = ap.parse_args()
    if not 1 <= args.burst <= 100:
        ap.error("--burst 1..100")
    variants: dict[str, tuple[type[SqliteInbox], type[InboxDatabase]]] = {}
    if args.sql_reads:
        variants["sql reads, savepoint per event"] = (SqlReadsSavepoint, InboxDatabase)
    variants["savepoint per event (before)"] = (SavepointCommit, InboxDatabase)
    variants["batch, every watermark row"] = (SqliteInbox, EveryWatermark)
    variants["batch at flush (lab.inbox)"] = (SqliteInbox, InboxDatabase)
    results: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            folder = Path(tmp) / f"r{r}"
            folder.mkdir()
            # Alternated, so that a noisy moment of the machine hits every variant.
            for name, kind in variants.items():
                results[name].append(one_round(kind, folder, args.clients, args.events, args.burst))
    print(
        f"{args.clients} clients x {args.events} events ({args.burst} in a row), {args.rounds} rounds"
        " (median of rounds)"
    )
    medians = {k: statistics.median(v) for k, v in results.items()}
    first = next(iter(medians.values()))
    for name, value in medians.items():
        rounds = ", ".join(f"{x:.1f}" for x in results[name])
        print(f"  {name:32s} {value:7.1f} µs CPU per event ({value / first:.2f})   rounds: {rounds}")


if __name__ == "__main__":
    main()
