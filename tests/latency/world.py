"""Synthetic runs for the lab-latency checks: clients on Locust workers, each with one
standalone stream whose requests reach the proxy and whose events reach the client with
the delays a test chooses, written as the ledgers hold them — client `http_exchanges`,
inbox receipts and `recoveries`; tap `flow` (with `t_request`), `sent` and `forwarded`
records; the nemesis's latency toxics — and the process samples where a test wants them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lab.checker.inputs.load import RunData
from lab.checker.inputs.records import run_data_from_records
from lab.wire.client_ledger import HttpExchange, Recovery

T0 = 1_800_000_000.0


def constant(seconds: float) -> Callable[[int, float], float]:
    return lambda _i, _t: seconds


@dataclass
class World:
    """`workers` Locust workers of `clients_per_worker` clients each; every client gets
    `events` events, one every `gap` s from T0 + 1. `delivery(worker, i, t)` and
    `request(worker, t)` give each event's and request's delay (s)."""

    workers: int = 2
    clients_per_worker: int = 3
    events: int = 100
    gap: float = 0.1
    delivery: Callable[[int, int, float], float] = lambda _w, _i, _t: 0.002
    request: Callable[[int, float], float] = lambda _w, _t: 0.001
    t_request: bool = True
    upstream: Callable[[int, int], float] | None = None
    """server send -> tap `sent` delay per (worker, event index); None: no server ledger."""
    recoveries: list[tuple[int, int, float, int]] = field(default_factory=list)
    """(worker, client, lost after T0 (s), event index that ended it)."""
    nemesis: list[dict[str, Any]] | None = None
    phases: list[dict[str, Any]] | None = None
    budgets: dict[str, Any] = field(default_factory=dict)

    def run_data(self) -> RunData:
        tap: list[dict[str, Any]] = []
        client: list[Any] = []
        inbox: list[dict[str, Any]] = []
        events_sent: list[dict[str, Any]] = []
        accepted: dict[tuple[str, int], float] = {}
        owner: dict[str, int] = {}
        for w in range(self.workers):
            for c in range(self.clients_per_worker):
                cid = f"w{w}-u{c}"
                owner[cid] = w
                flow = f"f-{cid}"
                sent_at = T0 + 0.5
                client.append(
                    HttpExchange(
                        cid, 1, "standalone", "GET", "get:1", 200, "s_1", 1, True, sent_at, T0 + 60, "", None
                    )
                )
                record: dict[str, Any] = {
                    "type": "flow",
                    "flow": flow,
                    "t": sent_at + 0.01,
                    "conn": f"{cid}:1",
                    "method": "GET",
                    "path": "/mcp",
                    "stream": "get",
                    "session": "s_1",
                    "jsonrpc_id": None,
                    "jsonrpc_method": None,
                    "idempotency_key": None,
                    "origin_in": None,
                    "origin_out": None,
                    "origin_allowed_out": None,
                    "last_event_id_in": None,
                    "last_event_id_out": None,
                    "status": 200,
                    "answered_by": "server",
                    "faults": [],
                }
                if self.t_request:
                    record["t_request"] = sent_at + self.request(w, sent_at)
                tap.append(record)
                for i in range(self.events):
                    t = T0 + 1 + i * self.gap
                    eid, digest = f"e-{cid}-{i}", f"d-{cid}-{i}"
                    common = {"flow": flow, "index": i, "event_id": eid, "digest": digest}
                    tap.append(
                        {
                            "type": "sent",
                            "t": t - 0.001,
                            **common,
                            "has_data": True,
                            "priming": False,
                            "stream_id": None,
                            "session": "s_1",
                        }
                    )
                    tap.append(
                        {
                            "type": "forwarded",
                            "t": t,
                            **common,
                            "source": {"flow": flow, "index": i},
                            "fault": None,
                            "rule": None,
                            "decision": None,
                        }
                    )
                    if self.upstream is not None:
                        events_sent.append(
                            {
                                "session": "s_1",
                                "stream_id": cid,
                                "event_id": eid,
                                "sequence": i,
                                "digest": digest,
                                "kind": "notification",
                                "jsonrpc_id": None,
                                "sent_at": t - 0.001 - self.upstream(w, i),
                                "replay": 0,
                                "conn": f"{cid}:1",
                            }
                        )
                    at = t + self.delivery(w, i, t)
                    accepted[(cid, i)] = at
                    inbox.append(
                        {
                            "client_id": cid,
                            "session_generation": 1,
                            "stream_key": "get:1",
                            "event_id": eid,
                            "message_digest": digest,
                            "sequence": i,
                            "server_stream_id": None,
                            "kind": "notification",
                            "jsonrpc_id": None,
                            "method": "notifications/message",
                            "conn_id": 1,
                            "accepted_at": at,
                        }
                    )
        for w, c, lost, index in self.recoveries:
            cid = f"w{w}-u{c}"
            client.append(
                Recovery(
                    cid,
                    "get:1",
                    None,
                    "cut_mid_event",
                    T0 + lost,
                    accepted[(cid, index)],
                    "resumed",
                    1,
                    False,
                )
            )
        end = T0 + 1 + self.events * self.gap + 1
        scenario: dict[str, Any] = {"name": "latency-world", "load": {"users": len(owner)}}
        if self.phases:
            scenario["phases"] = self.phases
        run = {
            "started_at": T0,
            "stopped_at": end,
            "complete": True,
            "end_reason": "duration",
            "scenario": scenario,
            "budgets": {"reconnect_qps": 50, "resume_p99_s": 5.0, "min_events": 10, **self.budgets},
        }
        server = {"events_sent": events_sent} if self.upstream is not None else None
        data = run_data_from_records(
            run=run, client=client, inbox=inbox, tap=tap, nemesis=self.nemesis, server=server
        )
        # One ledger file per worker, as `lab run` writes them (the loader numbers them).
        data.client_files = [f"clients/worker-{w}.sqlite" for w in range(self.workers)]
        assert data.client is not None
        for table in data.client.values():
            if "client_id" in table.columns and len(table):
                table["_src"] = table["client_id"].map(owner).astype("int64")
        return data


def latency_toxic(
    start: float, end: float, latency_ms: float, jitter_ms: float = 0.0
) -> list[dict[str, Any]]:
    """A nemesis latency toxic in place from T0 + start to T0 + end."""
    common = {"proxy": "mcp", "toxic": "slow", "kind": "latency", "stream": "downstream", "toxicity": 1.0}
    return [
        {
            "type": "toxic_added",
            "t": T0 + start,
            **common,
            "attributes": {"latency": latency_ms, "jitter": jitter_ms},
        },
        {"type": "toxic_removed", "t": T0 + end, **common, "attributes": {}},
    ]
