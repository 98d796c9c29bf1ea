"""Synthetic runs on a timeline, for the checker's phase analysis: each stretch of time
has its event rate, call rate and error share, recovery latency and reconnects, written
as the ledgers would hold them (tap `sent` records, client `operations`, `recoveries`,
`reconnects`), and the lab's process samples (`processes.jsonl`) where a test wants them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.checker import judge
from lab.checker.inputs.load import RunData
from lab.checker.inputs.records import run_data_from_records
from lab.checker.model import RunReport
from lab.wire.client_ledger import OperationRecord, ReconnectAttempt, Recovery

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class Stretch:
    """[start, end) seconds from T0, and what happened in it."""

    start: float
    end: float
    events_per_s: float = 50.0
    calls_per_s: float = 5.0
    error_share: float = 0.0
    recoveries_per_s: float = 1.0
    latency_s: float = 0.3
    reconnects_per_s: int = 1


def phase(name: str, kind: str, start: float, end: float, users: int = 10, **server: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "start": start,
        "duration": end - start,
        "users": users,
        "spawn_rate": 10.0,
        "server": server,
    }


def records(stretches: list[Stretch]) -> tuple[list[dict[str, Any]], list[Any]]:
    tap: list[dict[str, Any]] = []
    client: list[Any] = []
    n = 0
    for s in stretches:
        span = s.end - s.start
        for i in range(int(span * s.events_per_s)):
            t = T0 + s.start + i / s.events_per_s
            n += 1
            tap.append(
                {
                    "type": "sent",
                    "flow": f"f{n % 7}",
                    "t": t,
                    "index": n,
                    "event_id": None,  # no ID: nothing here for gate 1 to judge
                    "digest": f"d{n}",
                    "has_data": True,
                    "priming": False,
                    "stream_id": None,
                    "session": "s_1",
                }
            )
        calls = int(span * s.calls_per_s)
        for i in range(calls):
            failed = int((i + 1) * s.error_share) > int(i * s.error_share)  # spread evenly
            t = T0 + s.start + i / s.calls_per_s
            n += 1
            client.append(
                OperationRecord(
                    "c1", f"op{n}", "echo", False, "unknown" if failed else "ok", "", 1, t - 0.1, t, 0
                )
            )
        for i in range(int(span * s.recoveries_per_s)):
            t = T0 + s.start + i / s.recoveries_per_s
            n += 1
            client.append(
                Recovery("c1", f"post:{n}", None, "cut_mid_event", t, t + s.latency_s, "resumed", 1, False)
            )
        for sec in range(int(span)):
            for k in range(s.reconnects_per_s):
                t = T0 + s.start + sec + k / (s.reconnects_per_s + 1)
                client.append(
                    ReconnectAttempt("c1", "resume", "post:1", "cut", None, 0.1, t - 0.2, t, 0.2, 0, 1, 0)
                )
    return tap, client


def run_data(
    stretches: list[Stretch],
    phases: list[dict[str, Any]],
    *,
    budgets: dict[str, Any] | None = None,
    run_dir: Path | None = None,
) -> RunData:
    tap, client = records(stretches)
    end = max(s.end for s in stretches)
    run = {
        "started_at": T0,
        "stopped_at": T0 + end,
        "complete": True,
        "end_reason": "duration",
        "scenario": {"name": "world", "phases": phases, "load": {"users": 10}},
        "budgets": {"reconnect_qps": 50, "resume_p99_s": 5.0, "min_events": 10, **(budgets or {})},
    }
    data = run_data_from_records(run=run, client=client, tap=tap)
    if run_dir is not None:
        data.run_dir = run_dir
    return data


def judged(data: RunData) -> RunReport:
    return judge(data, witness_limit=10)


def write_samples(run_dir: Path, parts: dict[str, list[tuple[float, float, float]]], cpus: int = 2) -> None:
    """processes.jsonl: for each part, (start, end, cpu) stretches sampled once a second."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "monitor", "t": T0, "schema": "mcpLabProcesses.v1", "interval_s": 1.0, "cpus": cpus}]
    for part, spans in parts.items():
        for start, end, cpu in spans:
            for sec in range(int(start), int(end)):
                lines.append(
                    {
                        "type": "sample",
                        "t": T0 + sec + 0.5,
                        "part": part,
                        "pid": 100 + len(part),
                        "cpu": cpu,
                        "rss": 50_000_000,
                        "fds": 10,
                        "threads": 2,
                    }
                )
    (run_dir / "processes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
