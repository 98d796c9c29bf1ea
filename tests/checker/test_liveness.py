"""No silent hang passes, and no evidence is never a pass: calls that never got an outcome
count as never recovered in gate 5 whatever the client recorded; a throughput collapse is
marked next to the gates; every gate without evidence is inconclusive; a kill_session the
target refused (405) is said to be not applicable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from tests.checker.builders import Sim, clean_run


def _judge(sim: Sim, tmp_path: Path, name: str = "run", **write: bool) -> RunReport:
    return judge_dir(sim.write(tmp_path / name, **write))[1]


def _gate(report: RunReport, name: str) -> GateResult:
    return next(g for g in report.gates if g.gate == name)


def test_a_call_that_never_got_an_outcome_is_never_recovered_in_gate_5(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    pristine = _judge(sim, tmp_path, "pristine")
    assert _gate(pristine, "resume_p99").verdict is Verdict.PASS
    assert pristine.liveness is not None and pristine.liveness.calls_without_outcome == 0
    # A call the server answered with a stream that stays silent: the client never
    # recorded a loss (no recovery row) and never an outcome. The run goes on for 20 s.
    sim.call("a", 40, idempotency_key="op-a-40")
    sim.tick(20.0)
    report = _judge(sim, tmp_path, "hung")
    g = _gate(report, "resume_p99")
    assert g.verdict is Verdict.FAIL and g.measured["never_finished_calls"] == 1
    assert g.measured["p99_unbounded"] is True
    (w,) = g.witnesses
    assert w.check == "never_finished" and w.row["operation_key"] == "op-a-40"
    assert "never got an outcome" in w.explanation and w.refs[0].startswith("proxy/tap.jsonl:")
    assert report.liveness is not None
    assert report.liveness.calls_without_outcome == 1 and report.liveness.clients_stuck == ("a",)


def test_a_call_the_client_already_lists_as_never_recovered_counts_once(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    st = sim.call("a", 40, idempotency_key="op-a-40")
    sim.client_row(
        "recoveries",
        client_id="a",
        stream_key=st.key,
        operation_key="op-a-40",
        cause="connection_lost",
        lost_at=sim.t,
        recovered_at=None,
        path="abandoned",
        attempts=3,
        reinitialized=0,
    )
    sim.tick(20.0)
    g = _gate(_judge(sim, tmp_path), "resume_p99")
    assert g.verdict is Verdict.FAIL
    assert g.measured["never_recovered"] == 1 and g.measured["never_finished_calls"] == 0


def test_a_call_still_open_just_before_the_stop_is_censored(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.call("a", 40, idempotency_key="op-a-40")  # run.json stopped_at is 1 s later
    report = _judge(sim, tmp_path)
    assert _gate(report, "resume_p99").verdict is Verdict.PASS
    assert report.liveness is not None and report.liveness.calls_without_outcome == 0
    assert any("not counted" in n for n in report.liveness.notes)


def _busy_run(*, stall_from: int | None) -> Sim:
    """60 s of a client streaming 10 events a second on its GET; from `stall_from`
    seconds on, nothing more arrives though the stream stays open."""
    run = clean_run()
    sim = run.sim
    start = sim.t
    for second in range(60):
        if stall_from is not None and second >= stall_from:
            break
        sim.t = start + second
        sim.notify(run.get_a, 10)
    sim.t = start + 60.0
    # The stream was open throughout: the client's exchange spans the whole minute.
    for row in sim.client_rows["http_exchanges"]:
        if row["client_id"] == "a" and row["stream_key"] == "get:1":
            row["ended_at"] = sim.t
    return sim


def test_a_collapse_of_throughput_while_clients_wait_is_marked(tmp_path: Path) -> None:
    steady = _judge(_busy_run(stall_from=None), tmp_path, "steady")
    assert steady.liveness is not None and steady.liveness.collapses == ()
    stalled = _judge(_busy_run(stall_from=25), tmp_path, "stalled")
    assert stalled.liveness is not None
    (c,) = stalled.liveness.collapses
    started = stalled.run.started_at or 0.0
    assert 25 <= c.start - started <= 30 and c.end - c.start >= 20
    assert c.throughput == 0 and c.active_clients >= 1


def _no_evidence_budgets(sim: Sim) -> None:
    # A scenario that asked for no evidence at all: "0 of 0" must still not pass.
    sim.budgets |= {"min_events": 0, "min_recoveries": 0, "min_404": 0, "min_illegal_origin": 0}


def test_no_evidence_is_never_a_pass_even_when_the_scenario_asks_for_none(tmp_path: Path) -> None:
    sim = Sim()
    _no_evidence_budgets(sim)
    sim.initialize("a")
    get = sim.open_get("a")
    sim.notify(get, 3)
    report = _judge(sim, tmp_path)
    unmet = {g.gate: [e.name for e in g.evidence if not e.ok] for g in report.gates}
    assert unmet == {
        "cross_stream": ["stream crossings injected"],
        "duplicate_dispatch": ["writes retried"],
        "missing_rehandshake": ["404s to requests with a session"],
        "illegal_origin": ["illegal-Origin requests"],
        "resume_p99": ["recoveries"],
        "reconnect_qps": ["reconnects"],
    }
    assert {g.verdict for g in report.gates} == {Verdict.INCONCLUSIVE}
    g4 = _gate(report, "illegal_origin")
    assert g4.summary.startswith("0 of 0 illegal-Origin requests") and g4.budget["min_illegal_origin"] == 1
    assert _gate(report, "missing_rehandshake").budget["min_404"] == 1


def test_gate_1_without_any_receipt_is_inconclusive(tmp_path: Path) -> None:
    run = clean_run()
    sim = run.sim
    sim.client_rows["inbox"] = [r for r in sim.client_rows["inbox"] if r["kind"] == "priming"]
    g = _gate(_judge(sim, tmp_path), "cross_stream")
    assert g.verdict is Verdict.INCONCLUSIVE
    assert [e.name for e in g.evidence if not e.ok] == ["accepted messages checked"]


def _kill_session(sim: Sim, status: int) -> None:
    sim.tap.append(
        {
            "type": "fault",
            "t": sim.tick(),
            "fault": "kill_session",
            "rule": "r-kill",
            "decision": f"d_{len(sim.tap):016x}",
            "flow": None,
            "detail": {"delete_status": status, "session": "s_x"},
        }
    )


def test_a_kill_session_answered_405_is_not_applicable_and_gate_3_inconclusive(tmp_path: Path) -> None:
    sim = Sim()
    sim.initialize("a")
    get = sim.open_get("a")
    sim.notify(get, 12)
    for _ in range(3):
        _kill_session(sim, 405)
    report = _judge(sim, tmp_path, "refused")
    (na,) = report.faults_not_applicable
    assert na.fault == "kill_session" and na.count == 3
    assert "answered 405" in na.reason and "does not let clients terminate sessions" in na.reason
    g3 = _gate(report, "missing_rehandshake")
    assert g3.verdict is Verdict.INCONCLUSIVE
    unmet = {e.name: e.detail for e in g3.evidence if not e.ok}
    assert "not applicable" in unmet["kill_session applicable"]

    sim2 = clean_run().sim  # a target that lets clients end sessions: the fault applies
    _kill_session(sim2, 200)
    report2 = _judge(sim2, tmp_path, "accepted")
    assert report2.faults_not_applicable == ()
    assert _gate(report2, "missing_rehandshake").verdict is Verdict.PASS


def test_the_liveness_and_not_applicable_faults_reach_every_output(tmp_path: Path) -> None:
    import io
    import json

    from lab.report.outputs import report_run

    run = clean_run()
    sim = run.sim
    sim.call("b", 41, idempotency_key="op-b-41")
    _kill_session(sim, 405)
    sim.tick(20.0)
    run_dir = sim.write(tmp_path / "run")
    out: Any = io.StringIO()
    report_run(run_dir, witness_limit=5, figures=False, quiet=False, out=out, err=io.StringIO())
    assert "liveness: 1 call(s) never got an outcome" in out.getvalue()
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    assert doc["liveness"]["calls_without_outcome"] == 1 and doc["liveness"]["clients_stuck"] == ["b"]
    assert doc["faults"]["not_applicable"][0]["fault"] == "kill_session"
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## Liveness" in md and "Not applicable to this target: kill_session" in md
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    assert 'id="liveness"' in page and "Not applicable to this target" in page
    assert Attribution.UNATTRIBUTED.value in page


def test_a_toxic_whose_removal_failed_is_a_window_that_never_closed(tmp_path: Path) -> None:
    sim = clean_run().sim
    outcome = {"type": "toxic_outcome", "proxy": "mcp", "toxic": "lat1", "kind": "latency", "detail": None}
    sim.nemesis.append({**outcome, "t": sim.tick(), "action": "add", "outcome": "ok"})
    sim.nemesis.append({**outcome, "t": sim.tick(), "action": "remove", "outcome": "ok"})
    sim.nemesis.append({"type": "brand_new_record", "t": sim.tick()})  # unknown types are skipped
    report = _judge(sim, tmp_path, "closed")
    assert report.liveness is not None and report.liveness.notes == ()
    assert any("brand_new_record" in n for n in report.notes) and report.verdict is Verdict.PASS
    sim.nemesis.append({**outcome, "t": sim.tick(), "action": "remove", "outcome": "unknown"})
    report = _judge(sim, tmp_path, "open")
    assert report.liveness is not None
    (note,) = report.liveness.notes
    assert "toxic lat1 (latency) on proxy mcp: its removal unknown" in note and "never closed" in note
