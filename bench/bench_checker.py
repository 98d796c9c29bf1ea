"""Time and peak memory of `lab report`'s check on millions of synthetic ledger records,
next to pandas just reading the same files, and (with `--before REV`) next to REV's checker.

    python bench/bench_checker.py [--records 1000000 | --events N] [--clients 1000]
        [--server-events] [--long-form] [--before REV] [--mem-limit-gib 16]
        [--keep DIR | --reuse DIR]

The run folder is generated first (not timed): every SSE event the server sends leaves
four records, as in a real run — a tap `sent` and a tap `forwarded` record
(proxy/tap.jsonl: one line, as the proxy writes an untouched event; two with
`--long-form`), an inbox receipt and an outbox dispatch (clients/worker-{1,2}.sqlite) —
so 1,000,000 records are 250,000 events (with `--server-events`, a fifth record per
event in the server ledger's `events_sent`: 200,000 events), spread over `--clients`
clients with one standalone GET and four POST streams each; a tenth of the POST streams
are cut and resumed with GET + Last-Event-ID (so the resumption join is exercised), with
reconnects and recoveries; the server ledger holds sessions, streams, dispatches and
requests.

Then each measurement runs in a child process of its own (its peak RSS is its own
`ru_maxrss`; its address space is capped at `--mem-limit-gib`, so a reader that needs
more fails alone, said as such):
- pandas read only: `pandas.read_json(lines=True)` of the tap and `pandas.read_sql_query`
  of every table of every SQLite file (what "pandas reading the ledgers" costs);
- check: the checker's own loading (with `PRAGMA quick_check` of every SQLite ledger)
  plus every rule that applies to the run, the wire checks and liveness (no figures, no
  files written), with the time per gate; by REV's `lab/` (exported with `git archive`)
  and by this tree's, on the same folder.
Prints figures, and each peak RSS over the largest ledger file; asserts nothing
(machines are noisy).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _labrun import export_tree  # noqa: E402

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


class _Lines:
    """The tap, written line by line as it is generated (10M events would not fit as a list)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("w", encoding="utf-8")
        self.lines = 0

    def append(self, line: str) -> None:
        self._file.write(line)
        self._file.write("\n")
        self.lines += 1

    def close(self) -> None:
        self._file.close()


class Generator:
    def __init__(
        self, run_dir: Path, events: int, clients: int, server_events: bool, long_form: bool
    ) -> None:
        self.run_dir = run_dir
        self.server_events = server_events
        self.long_form = long_form
        self.events = events
        self.clients = clients
        (run_dir / "proxy").mkdir(parents=True)
        self.tap = _Lines(run_dir / "proxy" / "tap.jsonl")
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
                    sent_record: dict[str, Any] = {
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
                    if self.long_form:
                        self.tap.append(json.dumps(sent_record))
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
                    else:  # as the proxy writes an untouched event: one line for both
                        self.tap.append(json.dumps({**sent_record, "retry": None, "fwd": index}))
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
        self.tap.close()
        (self.run_dir / "clients").mkdir(parents=True)
        (self.run_dir / "server").mkdir()
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
            "tap lines": self.tap.lines,
            "tap flows": flows,
            "other client rows": sum(len(r) for w in self.ledger.values() for r in w.values()),
        }


READ_ONLY = """
import sqlite3, sys, time
from pathlib import Path
import pandas as pd
run_dir = Path(sys.argv[1])
started = time.perf_counter()
pd.read_json(run_dir / "proxy" / "tap.jsonl", lines=True)
for path in [*sorted((run_dir / "clients").glob("*.sqlite")), run_dir / "server" / "ledger.sqlite"]:
    db = sqlite3.connect(path)
    for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        pd.read_sql_query(f'SELECT * FROM "{table}"', db)
    db.close()
print(json.dumps({"total_s": time.perf_counter() - started}))
"""
"""pandas just reading the ledgers: `read_json(lines=True)` of the tap, `read_sql_query`
of every table of every SQLite file."""

CHECK = """
import sys, time
from pathlib import Path
from lab.checker.context import Context, parse_budgets
from lab.checker.inputs.load import load_run
from lab.checker.judge.verdict import run_rule
from lab.checker.rules import REGISTRY
started = time.perf_counter()
data = load_run(Path(sys.argv[1]))
loaded = time.perf_counter()
ctx = Context(data, parse_budgets(data.run))
per_gate, errors = {}, {}
for rule in REGISTRY.core():
    t = time.perf_counter()
    result = run_rule(rule, ctx)
    per_gate[rule.id] = time.perf_counter() - t
    if result.error is not None:
        errors[rule.id] = str(result.error)
print(json.dumps({"load_s": loaded - started, "total_s": time.perf_counter() - started,
                  "per_gate": per_gate, "errors": errors}))
"""
"""The checker's own loading (with `PRAGMA quick_check` of every SQLite ledger) plus
every rule that applies to the run, the wire checks and liveness (no figures, no files)."""


@dataclass
class Measured:
    label: str
    figures: dict[str, Any] | None
    peak_rss: int
    """Bytes (the child's ru_maxrss)."""
    failure: str | None = None


def measure(label: str, code: str, run_dir: Path, tree: Path, mem_limit: int) -> Measured:
    """Run `code` in a child Python with `tree` first on its path; its figures (a JSON line
    on stdout) and its peak RSS. The child's address space is capped at `mem_limit`
    bytes, so a reader that needs too much fails alone instead of taking the box down."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))

    env = dict(os.environ, PYTHONPATH=str(tree))
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import json\n" + code, str(run_dir)],
            env=env,
            cwd=tree,
            stdout=subprocess.PIPE,
            stderr=errors,
            preexec_fn=cap,
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        # wait4, not Popen.wait: the child's own rusage (its peak RSS), not the children's max.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        err = errors.read().decode(errors="replace")
    peak = usage.ru_maxrss * 1024
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        if "MemoryError" in err or proc.returncode < 0:
            last = f"out of memory at the cap of {mem_limit / GIB:.0f} GiB ({last[:80]})"
        return Measured(label, None, peak, last)
    return Measured(label, json.loads(out.decode().strip().splitlines()[-1]), peak)


GIB = 1 << 30


def _mb(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--records", type=int, default=1_000_000, help="ledger records (4 per event)")
    size.add_argument("--events", type=int, help="SSE events the tap records (instead of --records)")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument(
        "--server-events",
        action="store_true",
        help="also write the server ledger's events_sent (one more record per event)",
    )
    parser.add_argument(
        "--long-form",
        action="store_true",
        help="write every forwarded record on its own line (the tap before its short form)",
    )
    parser.add_argument("--before", metavar="REV", help="also check with REV's lab/, side by side")
    parser.add_argument("--mem-limit-gib", type=float, default=16.0, help="address-space cap of each child")
    parser.add_argument("--keep", type=Path, help="write the run folder here and keep it")
    parser.add_argument("--reuse", type=Path, help="check this folder (made by --keep) instead of generating")
    args = parser.parse_args()
    if args.reuse:
        run_dir = args.reuse / "run"
        root = None
        print(f"reusing {run_dir}")
    else:
        root = args.keep or Path(tempfile.mkdtemp(prefix="bench-checker-"))
        run_dir = root / "run"
        events = args.events or args.records // (5 if args.server_events else 4)
        t = time.perf_counter()
        gen = Generator(run_dir, events, args.clients, args.server_events, args.long_form)
        gen.generate()
        gen.write()
        counts = gen.counts()
        del gen
        total_records = sum(
            counts[k]
            for k in (
                "tap sent",
                "tap forwarded",
                "inbox receipts",
                "outbox dispatches",
                "server events_sent",
            )
        )
        print(f"generated {total_records:,} ledger records in {time.perf_counter() - t:.1f} s ({run_dir})")
        for name, n in counts.items():
            print(f"  {name:>18}: {n:,}")
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    print(
        f"  {'on disk':>18}: {_mb(sum(p.stat().st_size for p in files))}, largest ledger "
        f"{largest.relative_to(run_dir)} {_mb(largest.stat().st_size)}"
    )

    mem_limit = int(args.mem_limit_gib * GIB)
    trees: list[tuple[str, Path]] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-checker-trees-"))
    if args.before:
        trees.append(
            (f"check, {args.before[:9]}", export_tree(args.before, tmp / "before", "lab", "dashboards"))
        )
    trees.append(("check, this tree", ROOT))
    results = [measure("pandas read only", READ_ONLY, run_dir, ROOT, mem_limit)]
    for label, tree in trees:
        results.append(measure(label, CHECK, run_dir, tree, mem_limit))
    shutil.rmtree(tmp, ignore_errors=True)
    _print(results, largest.stat().st_size)
    if root is not None and args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


def _print(results: list[Measured], largest: int) -> None:
    print()
    print(f"{'':<26}{'time':>10}{'peak RSS':>14}{'RSS/largest':>13}{'time/read':>11}")
    read = results[0].figures["total_s"] if results[0].figures else None
    for m in results:
        if m.figures is None:
            print(f"{m.label:<26}{'failed':>10}{_mb(m.peak_rss):>14}   {m.failure}")
            continue
        total = m.figures["total_s"]
        ratio = f"{total / read:.2f}" if read else "-"
        print(f"{m.label:<26}{total:>8.2f} s{_mb(m.peak_rss):>14}{m.peak_rss / largest:>12.2f}x{ratio:>11}")
    checks = [m for m in results[1:] if m.figures is not None]
    if checks:
        print()
        print(f"{'':<26}" + "".join(f"{m.label[7:]:>18}" for m in checks))
        print(f"{'  loading':<26}" + "".join(f"{m.figures['load_s']:>16.2f} s" for m in checks if m.figures))
        for gate in checks[-1].figures["per_gate"] if checks[-1].figures else {}:
            row = "".join(
                f"{m.figures['per_gate'].get(gate, float('nan')):>16.2f} s" for m in checks if m.figures
            )
            print(f"{'  gate ' + gate:<26}{row}")
        for m in checks:
            for gate, error in (m.figures or {}).get("errors", {}).items():
                print(f"GATE {gate} FAILED TO RUN in {m.label}: {error}", file=sys.stderr)
    print("RSS/largest: the peak RSS over the largest ledger file of the run folder (aim <= 1.5).")
    print("(no faults were generated: the verdict would be inconclusive; it is not computed)")


if __name__ == "__main__":
    main()
