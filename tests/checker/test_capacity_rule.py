"""Rule 16 (`capacity`) on in-memory ledgers: a phase's requests the target left
unanswered, its time to answer at the proxy, and the lab's limits (a saturated lab
process, requests lost on the lab's hops, a busy box that excuses only what it could
cause). Each miss is seen to fail the rule against the server, each limit to make it
inconclusive, and the run without either to pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.checker import judge
from lab.checker.inputs.records import run_data_from_records
from lab.checker.model import GateResult, Verdict
from lab.wire.client_ledger import HttpExchange
from tests.phases.world import T0, Stretch, records, write_samples

PHASES = [
    {"name": "arrive", "kind": "ramp", "start": 0, "duration": 20, "users": 40, "spawn_rate": 2.0},
    {"name": "hold", "kind": "steady", "start": 20, "duration": 20, "users": 40, "spawn_rate": 2.0},
]


def flow(conn: int, t_request: float, head: float, status: int | None) -> dict[str, Any]:
    return {
        "type": "flow",
        "flow": f"f{conn}",
        "t": head,
        "t_request": t_request,
        "conn": f"c1:{conn}",
        "method": "POST",
        "path": "/mcp",
        "session": "s_1",
        "jsonrpc_id": conn,
        "jsonrpc_method": "tools/call",
        "idempotency_key": None,
        "origin_in": None,
        "origin_out": None,
        "origin_allowed_out": None,
        "last_event_id_in": None,
        "last_event_id_out": None,
        "status": status,
        "answered_by": "server" if status is not None else None,
        "faults": [],
    }


def run(
    tmp_path: Path,
    *,
    lost_in_hold: int = 0,
    lost_before_proxy: bool = False,
    answer_s: float = 0.05,
    samples: dict[str, list[tuple[float, float, float]]] | None = None,
    capacity: bool = True,
    phases: list[dict[str, Any]] = PHASES,
    answer_s_after: tuple[float, float] | None = None,
    extra: list[Any] | None = None,
) -> GateResult | None:
    """40 s, two phases, 5 calls a second; `lost_in_hold` of the hold's calls never answered
    (by the target, or before the proxy), each held 10 s until the client gave up."""
    client: list[Any] = list(extra or [])
    tap: list[dict[str, Any]] = []
    for conn in range(200):
        t = T0 + conn * 0.2
        lost = 100 <= conn < 100 + lost_in_hold
        if answer_s_after is not None and t - T0 >= answer_s_after[0]:
            answer_s = answer_s_after[1]
        end = t + (10.0 if lost else answer_s + 0.02)
        status = None if lost else 200
        client.append(
            HttpExchange(
                "c1",
                conn,
                "call",
                "POST",
                None,
                status,
                "s_1",
                1,
                True,
                t,
                end,
                "read_timeout" if lost else "",
                None,
            )
        )
        if not (lost and lost_before_proxy):
            tap.append(flow(conn, t + 0.01, end if lost else t + 0.01 + answer_s, status))
        tap.append(
            {
                "type": "sent",
                "flow": f"f{conn}",
                "t": t + 0.02,
                "index": 0,
                "event_id": None,
                "digest": f"d{conn}",
                "has_data": True,
                "priming": False,
                "stream_id": None,
                "session": "s_1",
            }
        )
    scenario: dict[str, Any] = {"name": "cap", "phases": phases, "load": {"users": 40}}
    if capacity:
        scenario["check"] = "capacity"
    doc = {
        "started_at": T0,
        "stopped_at": T0 + 40,
        "complete": True,
        "end_reason": "duration",
        "scenario": scenario,
        "budgets": {"reconnect_qps": 50, "resume_p99_s": 5.0, "min_events": 10},
    }
    data = run_data_from_records(run=doc, client=client, tap=tap)
    if samples is not None:
        write_samples(tmp_path, samples)
        data.run_dir = tmp_path
    rules = {g.gate: g for g in judge(data).gates}
    return rules.get("capacity")


def rule(tmp_path: Path, **kw: Any) -> GateResult:
    got = run(tmp_path, **kw)
    assert got is not None
    return got


def test_a_target_that_answers_everything_promptly_passes(tmp_path: Path) -> None:
    g = rule(tmp_path)
    assert g.verdict is Verdict.PASS, g.summary
    assert g.summary.startswith("0 of 200 requests unanswered by the target")
    phases = g.measured["phases"]
    assert isinstance(phases, list) and [p["phase"] for p in phases if isinstance(p, dict)] == [
        "arrive",
        "hold",
    ]


def test_the_rule_exists_only_in_a_capacity_check(tmp_path: Path) -> None:
    assert run(tmp_path, capacity=False) is None


def test_requests_the_target_never_answered_fail_it_against_the_server(tmp_path: Path) -> None:
    g = rule(tmp_path, lost_in_hold=5)  # 5 of the hold's 100: 5 %, over the 1 % budget
    assert g.verdict is Verdict.FAIL and g.violations == 1
    (w,) = g.witnesses
    assert w.check == "unanswered" and w.attribution.value == "server"
    assert "phase hold (40 clients): 5 of 100 requests (5.00%) went unanswered by the target" in w.explanation
    assert rule(tmp_path, lost_in_hold=1).verdict is Verdict.PASS  # 1 %: within the budget


def test_requests_lost_before_the_proxy_are_the_labs(tmp_path: Path) -> None:
    g = rule(tmp_path, lost_in_hold=5, lost_before_proxy=True)
    assert g.verdict is Verdict.INCONCLUSIVE and not g.witnesses
    assert "5 of 100 requests lost in the lab's part of the chain (client → proxy 5)" in g.summary


def test_a_slow_answer_fails_unless_mitmdump_was_saturated(tmp_path: Path) -> None:
    g = rule(tmp_path, answer_s=3.0)
    assert g.verdict is Verdict.FAIL and {w.check for w in g.witnesses} == {"answer_p99_s"}
    busy_proxy = {"mitmproxy": [(0, 40, 0.97)], "server": [(0, 40, 0.2)]}
    g = rule(tmp_path / "p", answer_s=3.0, samples=busy_proxy)
    assert g.verdict is Verdict.INCONCLUSIVE and not g.witnesses
    assert "limited by the lab (mitmproxy)" in g.summary


@pytest.mark.parametrize(("answer_s", "verdict"), [(0.05, Verdict.FAIL), (1.5, Verdict.INCONCLUSIVE)])
def test_a_busy_box_excuses_unanswered_requests_only_when_every_answer_was_slow(
    tmp_path: Path, answer_s: float, verdict: Verdict
) -> None:
    # The box at 2.0 of 2 cores, no lab process at its limit: the target shares the box.
    box = {"server": [(0, 40, 1.0)], "worker-0": [(0, 40, 0.5)], "mitmproxy": [(0, 40, 0.5)]}
    g = rule(tmp_path, lost_in_hold=5, answer_s=answer_s, samples=box)
    assert g.verdict is verdict, g.summary
    if verdict is Verdict.FAIL:  # answers came at once: the requests left without one are the target's
        assert {w.check for w in g.witnesses} == {"unanswered"}
    else:
        assert "the proxy's side was the lab's" in g.summary
    # With nothing missed, a busy box is a note, not a limit.
    calm = rule(tmp_path / "calm", samples=box)
    assert calm.verdict is Verdict.PASS and any("a busy box" in n for n in calm.notes)


def test_a_ramp_is_judged_up_to_its_knee(tmp_path: Path) -> None:
    # A stepped ramp whose last step's recoveries take 9 s (past the knee, as the capacity
    # section finds it) and whose answers there are slow: that step found the knee, and
    # is not held against the target; the steps before it are judged and hold.
    steps = [
        {"name": "ramp-10", "kind": "ramp", "start": 0, "duration": 5, "users": 10, "spawn_rate": 5.0},
        {"name": "hold-10", "kind": "steady", "start": 5, "duration": 15, "users": 10, "spawn_rate": 5.0},
        {"name": "ramp-20", "kind": "ramp", "start": 20, "duration": 5, "users": 20, "spawn_rate": 5.0},
        {"name": "hold-20", "kind": "steady", "start": 25, "duration": 15, "users": 20, "spawn_rate": 5.0},
    ]
    _, recoveries = records([Stretch(0, 20, latency_s=0.2), Stretch(20, 40, latency_s=9.0)])
    g = rule(tmp_path, phases=steps, answer_s_after=(20.0, 3.0), extra=recoveries)
    assert g.verdict is Verdict.PASS, g.summary
    phases = g.measured["phases"]
    assert isinstance(phases, list) and [p["phase"] for p in phases if isinstance(p, dict)] == [
        "ramp-10",
        "hold-10",
    ]
    assert any("the knee is at 10 clients" in n for n in g.notes), g.notes
