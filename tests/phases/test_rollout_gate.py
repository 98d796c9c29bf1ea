"""Gate 8 (rollout) on run folders built by hand: a rollout that keeps every promise
passes with all its evidence, and each named check fails on the one broken promise it
exists to catch (a crossing only the shadow ledger shows, a resumable share off the knob,
an old cursor refused, a new stream with event IDs, an expired session resumed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lab.checker import gate_check
from lab.checker.inputs.load import load_run
from lab.checker.model import GateResult, Verdict
from lab.checker.rules import rollout
from tests.checker.builders import T0, Sim

R = T0 + 20.0
"""When the rollback knob took effect."""
PHASES = [
    {"name": "shadow", "kind": "faults", "start": 0.0, "duration": 20.0, "users": 20, "spawn_rate": 20.0,
     "server": {"resumable_fraction": 0.5}},
    {"name": "rollback", "kind": "faults", "start": 20.0, "duration": 20.0, "users": 20, "spawn_rate": 20.0,
     "server": {"rollback": "keep-index"}},
    {"name": "past-ttl", "kind": "faults", "start": 40.0, "duration": 20.0, "users": 20, "spawn_rate": 20.0,
     "server": {}},
]  # fmt: skip


def at(sim: Sim, t: float) -> None:
    sim.t = T0 + t


def build(
    run_dir: Path,
    *,
    all_resumable: bool = False,
    crossed: bool = False,
    old_refused: bool = False,
    new_with_ids: bool = False,
    expired_resumed: bool = False,
) -> Path:
    sim = Sim()
    sim.budgets = {**sim.budgets, "min_events": 1, "min_rollout_sessions": 10}
    for i in range(20):
        at(sim, 1 + 0.1 * i)
        sim.initialize(f"c{i}")
    sessions = sim.server_rows["sessions"]
    for i, row in enumerate(sessions):  # the knob says 50 %: every other session resumable
        row["resumable"] = 1 if all_resumable or i % 2 == 0 else 0
        row["shadow"] = 1 - row["resumable"]
    # Before the rollback: a standalone stream, and calls whose streams the clients resume later.
    at(sim, 5)
    get0 = sim.open_get("c0")
    sim.notify(get0, 2)
    post1 = sim.call("c1", 2)
    sim.notify(post1, 2)
    at(sim, 6)
    post3 = sim.call("c3", 2)
    sim.notify(post3, 2)
    if crossed:  # the server sends on c1's stream a message its own ledger files under c0's GET
        ev = sim.send(post1, json.dumps({"jsonrpc": "2.0", "method": "x", "params": {"n": 1}}), accept=False)
        sim.server_rows["events_sent"][-1]["stream_id"] = get0.stream_id
        assert ev.flow == post1.flow
    # After the rollback: an old cursor resumed; a new stream (no event IDs).
    at(sim, 25)
    lost = sim.cut_and_resume(post1)
    resume_flow = sim.tap[-1]
    if old_refused:
        resume_flow["status"] = 400
    else:
        sim.notify(post1, 1)
        sim.recovered(post1, lost, sim.t)
    at(sim, 26)
    new = sim.call("c2", 2)
    first_new = len(sim.tap)
    sim.send(
        new, json.dumps({"jsonrpc": "2.0", "id": 2, "result": {"ok": True}}), kind="response", accept=False
    )
    if not new_with_ids:
        for record in sim.tap[first_new - 2 :]:  # its priming event and its response carry no ID
            if record.get("flow") == new.flow and record["type"] in ("sent", "forwarded"):
                record["event_id"] = None
                if record["type"] == "sent":
                    record["stream_id"] = None
    # c3's session expires (idle past its TTL); then c3 comes back with its old cursor.
    sessions[3]["ended_at"], sessions[3]["end_reason"] = T0 + 45, "expired"
    at(sim, 50)
    sim.cut_and_resume(post3)
    sim.tap[-1]["status"] = 200 if expired_resumed else 404
    at(sim, 59)
    sim.write(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["scenario"] = {"name": "rollout-built", "phases": PHASES, "load": {"users": 20}}
    run["stopped_at"] = T0 + 60
    (run_dir / "run.json").write_text(json.dumps(run))
    knobs = [
        {"type": "timeline", "t": T0, "schema": "mcpLabPhases.v1", "run_start": T0, "phases": []},
        {"type": "knobs", "t": T0 + 0.2, "phase": "shadow", "knobs": {"resumable_fraction": 0.5},
         "via": "settings", "status": None, "answer": None, "error": None},
        {"type": "knobs", "t": R, "phase": "rollback", "knobs": {"rollback": "keep-index"},
         "via": "admin", "status": 200, "answer": {"rollback": True}, "error": None},
    ]  # fmt: skip
    (run_dir / "phases.jsonl").write_text("".join(json.dumps(k) + "\n" for k in knobs))
    return run_dir


def judge(run_dir: Path) -> tuple[GateResult, dict[str, Any]]:
    data = load_run(run_dir)
    result = gate_check(data, rollout)
    measured: dict[str, Any] = dict(result.measured["checks"])  # type: ignore[arg-type]
    return result, measured


def test_a_rollout_that_keeps_every_promise_passes_with_its_evidence(tmp_path: Path) -> None:
    result, checks = judge(build(tmp_path))
    assert result.verdict is Verdict.PASS, [(e.name, e.observed) for e in result.evidence if not e.ok]
    assert all(c["violations"] == 0 for c in checks.values())
    assert checks["old_cursors_resume"]["resumed"] == 1
    assert checks["new_streams_not_resumable"]["new_streams"] == 1
    assert checks["expired_cursors_rejected"]["rejected_404"] == 1
    assert checks["cross_stream"]["shadow_crossed"] == 0 and checks["cross_stream"]["shadow_events"] > 0


@pytest.mark.parametrize(
    ("broken", "check"),
    [
        ({"crossed": True}, "cross_stream"),
        ({"all_resumable": True}, "resumable_share"),
        ({"old_refused": True}, "old_cursors_resume"),
        ({"new_with_ids": True}, "new_streams_not_resumable"),
        ({"expired_resumed": True}, "expired_cursors_rejected"),
    ],
)
def test_each_check_fails_on_the_promise_it_guards(
    tmp_path: Path, broken: dict[str, bool], check: str
) -> None:
    result, checks = judge(build(tmp_path, **broken))
    assert result.verdict is Verdict.FAIL
    assert {name for name, c in checks.items() if c["violations"]} == {check}
    assert {w.check for w in result.witnesses} == {check}


def test_without_the_knob_log_or_the_server_ledger_it_cannot_pass(tmp_path: Path) -> None:
    run_dir = build(tmp_path)
    (run_dir / "phases.jsonl").unlink()
    assert gate_check(load_run(run_dir), rollout).verdict is Verdict.INCONCLUSIVE
    (run_dir / "server" / "ledger.sqlite").unlink()
    result = gate_check(load_run(run_dir), rollout)
    assert result.verdict is Verdict.INCONCLUSIVE and "server's ledger" in result.summary


def test_the_first_phases_knobs_hold_from_its_start_however_late_their_record(tmp_path: Path) -> None:
    # The server starts with the first phase's knobs (`via` settings); a busy box wrote
    # their record 5 s in, after every session of the phase was made (CI, 2026-12-07).
    run_dir = build(tmp_path)
    lines = [json.loads(x) for x in (run_dir / "phases.jsonl").read_text().splitlines()]
    for x in lines:
        if x.get("via") == "settings":
            x["t"] = T0 + 5.0
    (run_dir / "phases.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result, _ = judge(run_dir)
    assert result.verdict is Verdict.PASS, [(e.name, e.observed) for e in result.evidence if not e.ok]
    assert ("sessions created in shadow", 20) in [(e.name, e.observed) for e in result.evidence]
