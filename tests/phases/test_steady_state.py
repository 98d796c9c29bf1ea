"""The per-phase table and gate 7 (steady state restored), on synthetic timelines: each
is shown passing on a good run and failing, or inconclusive, on one built to break it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.checker import gate_check
from lab.checker.model import Verdict
from lab.checker.rules import steady_state
from tests.phases.world import Stretch, judged, phase, run_data, write_samples

PHASES = [
    phase("steady", "steady", 0, 60),
    phase("storm", "faults", 60, 100),
    phase("recovery", "recovery", 100, 160),
]
STEADY = Stretch(0, 60, events_per_s=40, latency_s=0.3)
STORM = Stretch(60, 100, events_per_s=8, error_share=0.3, latency_s=4.0, reconnects_per_s=6)
AFTERMATH = Stretch(100, 130, events_per_s=20, error_share=0.1, latency_s=2.0)


def table_of(report: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = report.sections["phases"]
    return rows


def test_phase_table_measures_each_phase() -> None:
    data = run_data([STEADY, STORM, AFTERMATH, Stretch(130, 160, events_per_s=40)], PHASES)
    report = judged(data)
    table = {p["name"]: p for p in table_of(report)}
    assert list(table) == ["steady", "storm", "recovery"]
    assert table["steady"]["events_per_s"] == 40.0 and table["storm"]["events_per_s"] == 8.0
    assert table["storm"]["call_error_rate"] == 0.3 and table["steady"]["call_error_rate"] == 0.0
    assert table["storm"]["resume_p99_s"] == 4.0 and table["steady"]["resume_p50_s"] == 0.3
    assert table["storm"]["reconnect_qps_peak"] == 6 and table["steady"]["reconnect_qps_peak"] == 1
    assert table["recovery"]["kind"] == "recovery" and table["recovery"]["reached"] is True


def test_a_run_without_phases_is_one_implicit_phase() -> None:
    data = run_data([Stretch(0, 30, events_per_s=10)], [])
    table = table_of(judged(data))
    assert len(table) == 1 and table[0]["name"] == "run" and table[0]["events"] == 300
    assert [g.number for g in judged(data).gates] == [1, 2, 3, 4, 5, 6]  # no recovery phase: no gate 7


def test_gate7_passes_when_the_last_half_is_back_to_the_baseline() -> None:
    data = run_data([STEADY, STORM, AFTERMATH, Stretch(130, 160, events_per_s=39, latency_s=0.35)], PHASES)
    result = gate_check(data, steady_state)
    assert result.verdict is Verdict.PASS, result
    judged_phases: Any = result.measured["phases"]
    assert judged_phases[0]["missed"] == []
    report = judged(data)
    assert [g.number for g in report.gates][-1] == 7  # judged with the others


def test_gate7_fails_when_the_storm_stays_on_and_names_phase_and_metric() -> None:
    kept_on = Stretch(100, 160, events_per_s=8, error_share=0.3, latency_s=4.0, reconnects_per_s=6)
    result = gate_check(run_data([STEADY, STORM, kept_on], PHASES), steady_state)
    assert result.verdict is Verdict.FAIL
    metrics = {w.row["metric"] for w in result.witnesses}
    assert metrics == {"events_per_s", "resume_p99_s", "call_error_rate"}
    assert all("'recovery'" in w.explanation and "'steady'" in w.explanation for w in result.witnesses)


def test_gate7_is_inconclusive_without_a_baseline_or_with_too_few_events() -> None:
    no_steady = [phase("storm", "faults", 0, 60), phase("recovery", "recovery", 60, 120)]
    result = gate_check(run_data([Stretch(0, 120)], no_steady), steady_state)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert not next(e for e in result.evidence if e.name == "steady baseline phase").ok
    thin = run_data([Stretch(0, 60, events_per_s=1), Stretch(60, 160, events_per_s=1)], PHASES)
    result = gate_check(thin, steady_state)
    assert result.verdict is Verdict.INCONCLUSIVE  # 30 events in the baseline's last half < 100
    assert not next(e for e in result.evidence if e.name == "baseline events").ok


def test_tolerances_come_from_the_budgets() -> None:
    slower = [STEADY, STORM, AFTERMATH, Stretch(130, 160, events_per_s=30)]  # 75 % of the baseline
    assert gate_check(run_data(slower, PHASES), steady_state).verdict is Verdict.FAIL
    lenient = run_data(slower, PHASES, budgets={"recovery_events_ratio": 0.7})
    assert gate_check(lenient, steady_state).verdict is Verdict.PASS


def test_a_miss_while_the_lab_was_saturated_is_the_labs_not_the_targets(tmp_path: Path) -> None:
    kept_on = Stretch(100, 160, events_per_s=8, error_share=0.3, latency_s=4.0)
    write_samples(tmp_path, {"worker-0": [(0, 100, 0.3), (100, 160, 0.97)], "server": [(0, 160, 0.99)]})
    data = run_data([STEADY, STORM, kept_on], PHASES, run_dir=tmp_path)
    result = gate_check(data, steady_state)
    assert result.verdict is Verdict.INCONCLUSIVE and result.violations == 0
    lab = next(e for e in result.evidence if e.name == "lab not saturated")
    assert not lab.ok and "worker-0" in str(lab.observed) and "workers needed" in lab.detail
    # The server is the target: its saturation alone is the target's.
    write_samples(tmp_path, {"worker-0": [(0, 160, 0.3)], "server": [(0, 160, 0.99)]})
    assert gate_check(run_data([STEADY, STORM, kept_on], PHASES, run_dir=tmp_path), steady_state).verdict is (
        Verdict.FAIL
    )


def test_gate5_failing_while_a_worker_was_saturated_names_the_lab(tmp_path: Path) -> None:
    slow = [Stretch(0, 30, latency_s=0.3), Stretch(30, 60, latency_s=8.0)]  # p99 8 s > 5 s budget
    write_samples(tmp_path / "hot", {"worker-0": [(0, 30, 0.3), (30, 60, 0.99)]})
    write_samples(tmp_path / "cool", {"worker-0": [(0, 60, 0.3)]})
    hot = {g.gate: g for g in judged(run_data(slow, [], run_dir=tmp_path / "hot")).gates}["resume_p99"]
    cool = {g.gate: g for g in judged(run_data(slow, [], run_dir=tmp_path / "cool")).gates}["resume_p99"]
    assert cool.verdict is Verdict.FAIL
    assert hot.verdict is Verdict.INCONCLUSIVE and "limited by the lab (worker-0" in hot.summary
    assert not next(e for e in hot.evidence if e.name == "lab not saturated").ok


def _slow_recovery_phase(target_p99: float | None) -> tuple[Any, dict[str, float]]:
    """The kept-on storm's recovery phase metrics (total resume p99 4 s, against a limit
    of 0.7 s), with the target's share of that p99 set to `target_p99`."""
    from dataclasses import replace

    from lab.checker.context import Context, parse_budgets
    from lab.checker.timeline import phases

    kept_on = Stretch(100, 160, events_per_s=40, latency_s=4.0)
    data = run_data([STEADY, STORM, kept_on], PHASES)
    ctx = Context(data, parse_budgets(data.run), 20)
    specs = phases.specs(ctx)
    base = phases.phase_metrics(ctx, specs[0], last_half=True)
    m = phases.phase_metrics(ctx, specs[2], last_half=True)
    assert base is not None and m is not None
    lim = steady_state.limits(base, phases.tolerances(data.run))
    return replace(m, resume_target_p99=target_p99), lim


def test_gate7_judges_resume_latency_on_the_targets_share() -> None:
    # The whole p99 is over the limit, the target's share is not: the lab's, not a miss.
    m, lim = _slow_recovery_phase(target_p99=0.2)
    assert [name for name, _, _ in steady_state.misses(m, lim)] == []
    share = steady_state.resume_share_verdict(m, lim)
    assert share is not None and share.limited_by_lab and "limited by the lab" in share.text
    # The target's share alone over the limit: a miss, measured on that share.
    m, lim = _slow_recovery_phase(target_p99=3.0)
    assert steady_state.misses(m, lim) == [("resume_p99_s", 3.0, lim["resume_p99_s_max"])]
    # Not split at all: judged on the whole latency, as before.
    m, lim = _slow_recovery_phase(target_p99=None)
    assert [name for name, _, _ in steady_state.misses(m, lim)] == ["resume_p99_s"]
