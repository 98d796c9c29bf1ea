"""Time of `lab report`'s check on 1,000,000 synthetic ledger records, next to the time
pandas needs just to read the same files.

    python bench/bench_checker.py [--records 1000000] [--clients 1000] [--server-events] [--keep DIR]

The run folder is generated first (not timed): every SSE event the server sends leaves
four records, as in a real run — a tap `sent` and a tap `forwarded` record
(proxy/tap.jsonl), an inbox receipt and an outbox dispatch (clients/worker-{1,2}.sqlite)
— so 1,000,000 records are 250,000 events (with `--server-events`, a fifth record per
event in the server ledger's `events_sent`: 200,000 events), spread over `--clients`
clients with one
standalone GET and four POST streams each; a tenth of the POST streams are cut and
resumed with GET + Last-Event-ID (so the resumption join is exercised), with reconnects
and recoveries; the server ledger holds sessions, streams, dispatches and requests.

Then, side by side:
- read only: `pandas.read_json(lines=True)` of the tap and `pandas.read_sql_query` of
  every table of every SQLite file (what "pandas reading the ledgers" costs);
- check: `lab.checker.judge_dir` — the checker's own loading (with `PRAGMA quick_check` of every
  SQLite ledger) plus every rule that applies to the run, the wire checks and liveness
  (no figures, no files written), with the time per gate.
Prints figures; asserts nothing (machines are noisy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.checker.context import Context, parse_budgets  # noqa: E402
from lab.checker.inputs.load import load_run  # noqa: E402
from lab.checker.judge.verdict import judge, run_rule  # noqa: E402
from lab.checker.rules import REGISTRY  # noqa: E402
from lab.inbox import connect  # noqa: E402
from lab.wire.client_ledger import RECORD_TYPES  # noqa: E402

T0 = 1_700_000_000.0
EVENT_RATE = 2_000.0
"""Synthetic events per second of run time (sets the spread of the time axis)."""
POSTS_PER_CLIENT = 4
WORKERS = 2


def _digest(data: str) -> str:
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def _event_id(tag: str, stream_id: str, seq: int, digest: str) -> str:
    # Shaped like an `e1` ID (the checker reads the stream ID the tap decoded).
    return f"e1.{tag}.0.{stream_id}.{seq}.{digest[:12]}.{'M' * 16}"


class Generator:
    def __init__(self, run_dir: Path, records: int, clients: int, server_events: bool) -> None:
        self.run_dir = run_dir
        self.server_events = server_events
        self.events = records // (5 if server_events else 4)
        self.clients = clients
        self.tap: list[str] = []
        self.inbox: dict[int, list[tuple[Any, ...]]] = {w: [] for w in range(WORKERS)}
        self.outbox: dict[int, list[tuple[Any, ...]]] = {w: [] for w in range(WORKERS)}
        self.ledger: dict[int, dict[str, list[tuple[Any, ...]]]] = {w: {} for w in range(WORKERS)}
        self.server: dict[str, list[tuple[Any, ...]]] = {}
        self.flows = 0
        self.t = T0

    def _flow(self, conn: str, method: str, session: str, **extra: Any) -> str:
        self.flows += 1
        flow = f"f{self.flows}"
        record = {
            "type": "flow",
            "flow": flow,
            "t": self.t,
            "conn": conn,
            "method": method,
            "path": "/mcp",
            "session": session,
            "jsonrpc_id": None,
            "jsonrpc_method": None,
            "idempotency_key": None,
            "origin_in": "http://127.0.0.1",
            "origin_out": "http://127.0.0.1",
            "origin_allowed_out": True,
            "last_event_id_in": None,
            "last_event_id_out": None,
            "status": 200,
            "answered_by": "server",
            "faults": [],
        }
        record.update(extra)
        self.tap.append(json.dumps(record))
        return flow

    def _row(self, worker: int, table: str, *values: Any) -> None:
        self.ledger[worker].setdefault(table, []).append(values)

    def generate(self) -> None:
        streams_per_client = 1 + POSTS_PER_CLIENT
        per_stream = max(2, self.events // (self.clients * streams_per_client))
        sent = 0
        for c in range(self.clients):
            client, worker = f"c{c}", c % WORKERS
            session, tag = f"s_{c:020x}", f"{c:011d}"
            conn_n = 1
            self._row(worker, "sessions", client, session, 1, "established", "2025-11-25", self.t)
            self._row(
                worker,
                "http_exchanges",
                client,
                conn_n,
                "initialize",
                "POST",
                None,
                200,
                None,
                1,
                0,
                self.t,
                self.t,
                "",
                None,
            )
            self.server.setdefault("sessions", []).append(
                (
                    session,
                    client,
                    client,
                    "0" * 64,
                    "2025-11-25",
                    "http://127.0.0.1",
                    self.t,
                    self.t + 600,
                    0,
                    1,
                    0,
                    None,
                    None,
                )
            )
            for s in range(streams_per_client):
                conn_n += 1
                conn = f"{client}:{conn_n}"
                is_get = s == 0
                key = "get:1" if is_get else f"post:{s}"
                stream_id = f"g{c}" if is_get else f"p{c}x{s}"
                flow = self._flow(
                    conn, "GET" if is_get else "POST", session, jsonrpc_id=None if is_get else s
                )
                purpose = "standalone" if is_get else "call"
                self._row(
                    worker,
                    "http_exchanges",
                    client,
                    conn_n,
                    purpose,
                    "GET" if is_get else "POST",
                    key,
                    200,
                    session,
                    1,
                    1,
                    self.t,
                    self.t + 1,
                    "",
                    None,
                )
                self.server.setdefault("streams", []).append(
                    (
                        session,
                        stream_id,
                        "GET" if is_get else "POST",
                        None if is_get else str(s),
                        None,
                        conn,
                        self.t,
                        None,
                        None,
                        1000,
                        None,
                        None,
                    )
                )
                resume_at = per_stream // 2 if (not is_get and (c + s) % 10 == 0) else -1
                index = 0
                last_id = ""
                for seq in range(per_stream):
                    if seq == resume_at:
                        lost_at = self.t
                        self.t += 0.2
                        conn_n += 1
                        conn = f"{client}:{conn_n}"
                        flow = self._flow(
                            conn, "GET", session, last_event_id_in=last_id, last_event_id_out=last_id
                        )
                        self._row(
                            worker,
                            "http_exchanges",
                            client,
                            conn_n,
                            "resume",
                            "GET",
                            key,
                            200,
                            session,
                            1,
                            1,
                            self.t,
                            self.t + 1,
                            "",
                            last_id,
                        )
                        self._row(
                            worker,
                            "reconnects",
                            client,
                            "resume",
                            key,
                            "connection_lost",
                            0.1,
                            0.2,
                            lost_at,
                            self.t,
                            0.2,
                            0,
                            conn_n,
                            1,
                        )
                        self._row(
                            worker,
                            "recoveries",
                            client,
                            key,
                            None,
                            "connection_lost",
                            lost_at,
                            self.t + 0.01,
                            "resumed",
                            1,
                            0,
                        )
                        index = 0
                    self.t += 1.0 / EVENT_RATE
                    data = json.dumps(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/progress",
                            "params": {"c": c, "s": s, "n": seq},
                        }
                    )
                    digest = _digest(data)
                    event_id = _event_id(tag, stream_id, seq, digest)
                    self.tap.append(
                        json.dumps(
                            {
                                "type": "sent",
                                "flow": flow,
                                "t": self.t,
                                "index": index,
                                "event_id": event_id,
                                "digest": digest,
                                "has_data": True,
                                "priming": False,
                                "stream_id": stream_id,
                                "session": session,
                            }
                        )
                    )
                    self.tap.append(
                        json.dumps(
                            {
                                "type": "forwarded",
                                "flow": flow,
                                "t": self.t,
                                "index": index,
                                "event_id": event_id,
                                "digest": digest,
                                "source": {"flow": flow, "index": index},
                                "fault": None,
                                "rule": None,
                                "decision": None,
                            }
                        )
                    )
                    self.inbox[worker].append(
                        (
                            client,
                            1,
                            key,
                            event_id,
                            digest,
                            seq,
                            stream_id,
                            "notification",
                            None,
                            "notifications/progress",
                            conn_n,
                            self.t,
                            data,
                        )
                    )
                    self.outbox[worker].append(
                        (client, f"ev:1:{key}:{event_id}", 1, key, event_id, digest, "notification", self.t)
                    )
                    if self.server_events:
                        self.server.setdefault("events_sent", []).append(
                            (session, stream_id, event_id, seq, digest, "notification", None, self.t, 0, conn)
                        )
                    last_id = event_id
                    index += 1
                    sent += 1
        self.sent = sent

    def write(self) -> None:
        (self.run_dir / "clients").mkdir(parents=True)
        (self.run_dir / "proxy").mkdir()
        (self.run_dir / "server").mkdir()
        (self.run_dir / "proxy" / "tap.jsonl").write_text("\n".join(self.tap) + "\n", encoding="utf-8")
        for w in range(WORKERS):
            db = connect(self.run_dir / "clients" / f"worker-{w + 1}.sqlite")
            db.execute("BEGIN")
            db.executemany(f"INSERT INTO inbox VALUES ({','.join('?' * 13)})", self.inbox[w])
            db.executemany(f"INSERT INTO outbox VALUES ({','.join('?' * 8)})", self.outbox[w])
            for rtype in RECORD_TYPES:
                cols = [f.name for f in fields(rtype)]
                db.execute(f"CREATE TABLE {rtype.table} ({', '.join(cols)})")
                rows = self.ledger[w].get(rtype.table, [])
                if rows:
                    db.executemany(f"INSERT INTO {rtype.table} VALUES ({','.join('?' * len(cols))})", rows)
            db.execute("COMMIT")
            db.close()
        db = sqlite3.connect(self.run_dir / "server" / "ledger.sqlite")
        db.executescript(
            "CREATE TABLE sessions (session, principal, auth_subject, handshake_receipt, protocol_version, origin_policy,"
            " created_at, expires_at, generation, resumable, shadow, ended_at, end_reason);"
            "CREATE TABLE streams (session, stream_id, opened_by, request_id, payload_digest, conn, opened_at,"
            " last_sent_event_id, last_acked_event_id, retry_ms, closed_at, close_reason);"
            "CREATE TABLE events_sent (session, stream_id, event_id, sequence, digest, kind, jsonrpc_id, sent_at, replay, conn);"
            "CREATE TABLE dispatches (idempotency_key, session, auth_subject, request_id, tool, effect, at);"
            "CREATE TABLE requests (at, method, conn, session, status, reason, origin, origin_allowed, protocol_version,"
            " last_event_id, cursor_verdict);"
        )
        db.executemany(f"INSERT INTO sessions VALUES ({','.join('?' * 13)})", self.server["sessions"])
        db.executemany(f"INSERT INTO streams VALUES ({','.join('?' * 12)})", self.server["streams"])
        db.executemany(
            f"INSERT INTO events_sent VALUES ({','.join('?' * 10)})", self.server.get("events_sent", [])
        )
        db.commit()
        db.close()
        run = {
            "schema": "mcpLabRun.v1",
            "run_id": self.run_dir.name,
            "scenario": {"name": "bench"},
            "seed": 1,
            "started_at": T0,
            "stopped_at": self.t + 1,
            "complete": True,
            "end_reason": "event_target",
            "budgets": {
                "reconnect_qps": 1000.0,
                "resume_p99_s": 5.0,
                "min_events": 100_000,
                "min_recoveries": 1,
                "min_404": 1,
                "min_illegal_origin": 1,
                "cross_stream_max": 0,
                "duplicate_dispatch_max": 0,
                "missing_rehandshake_max": 0,
                "origin_reject_rate": 1.0,
            },
            "fault_windows": [],
        }
        (self.run_dir / "run.json").write_text(json.dumps(run), encoding="utf-8")

    def counts(self) -> dict[str, int]:
        flows = self.flows
        return {
            "tap sent": self.sent,
            "tap forwarded": self.sent,
            "inbox receipts": sum(len(v) for v in self.inbox.values()),
            "outbox dispatches": sum(len(v) for v in self.outbox.values()),
            "server events_sent": len(self.server.get("events_sent", [])),
            "tap flows": flows,
            "other client rows": sum(len(r) for w in self.ledger.values() for r in w.values()),
        }


def read_only(run_dir: Path) -> float:
    started = time.perf_counter()
    pd.read_json(run_dir / "proxy" / "tap.jsonl", lines=True)
    for path in [*sorted((run_dir / "clients").glob("*.sqlite")), run_dir / "server" / "ledger.sqlite"]:
        db = sqlite3.connect(path)
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            pd.read_sql_query(f'SELECT * FROM "{table}"', db)
        db.close()
    return time.perf_counter() - started


def check(run_dir: Path) -> tuple[float, float, dict[str, float], str]:
    started = time.perf_counter()
    data = load_run(run_dir)
    loaded = time.perf_counter()
    ctx = Context(data, parse_budgets(data.run))
    per_gate: dict[str, float] = {}
    for rule in REGISTRY.core():
        t = time.perf_counter()
        result = run_rule(rule, ctx)
        per_gate[rule.id] = time.perf_counter() - t
        if result.error is not None:
            # A gate that crashed is fast: its time would mean nothing. Say so loudly.
            print(f"GATE {rule.id} FAILED TO RUN: {result.error}", file=sys.stderr)
    total = time.perf_counter() - started
    # The verdicts as `lab report` gives them (the joins are cached in ctx above, so
    # this is timed apart and not added).
    verdict = judge(data).verdict
    return loaded - started, total, per_gate, str(verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument(
        "--server-events",
        action="store_true",
        help="also write the server ledger's events_sent (one more record per event)",
    )
    parser.add_argument("--keep", type=Path, help="write the run folder here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-checker-"))
    run_dir = root / "run"
    t = time.perf_counter()
    gen = Generator(run_dir, args.records, args.clients, args.server_events)
    gen.generate()
    gen.write()
    counts = gen.counts()
    total_records = sum(
        counts[k]
        for k in ("tap sent", "tap forwarded", "inbox receipts", "outbox dispatches", "server events_sent")
    )
    print(f"generated {total_records:,} ledger records in {time.perf_counter() - t:.1f} s ({run_dir})")
    for name, n in counts.items():
        print(f"  {name:>18}: {n:,}")
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    print(f"  {'on disk':>18}: {size / 1e6:.0f} MB")

    read_s = read_only(run_dir)
    load_s, check_s, per_gate, verdict = check(run_dir)
    print()
    print(f"{'pandas read only':<34}{read_s:8.2f} s   (read_json of the tap + read_sql_query of every table)")
    print(f"{'check: load + every rule':<34}{check_s:8.2f} s   (lab.checker; aim <= 10 s)")
    print(f"{'  of which loading':<34}{load_s:8.2f} s")
    for gate, seconds in per_gate.items():
        print(f"{'  gate ' + gate:<34}{seconds:8.2f} s")
    print(f"{'ratio check / read only':<34}{check_s / read_s:8.2f}")
    print(f"verdict of the synthetic run: {verdict} (no faults were generated: inconclusive is expected)")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
