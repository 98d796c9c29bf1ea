"""A capacity check's reading of the rules (lab.checker.judge.capacity_check): a rule that
lacks only what faults make is not applicable there (gate 1 passes on what it has); a
violation, or any other missing evidence, is left as it was. No I/O."""

from __future__ import annotations

from dataclasses import replace

from lab.checker import REGISTRY
from lab.checker.judge.capacity_check import declared, waive
from lab.checker.model import Evidence, GateResult, Verdict, decide

EVENTS = Evidence("events", 100, 5_000, True)
FROM_FAULTS = Evidence("404s to requests with a session", 1, 0, False, from_faults=True)


def result(*evidence: Evidence, violations: int = 0) -> GateResult:
    return GateResult(
        verdict=decide(violations > 0, evidence),
        summary="0 of 0 session 404s not followed by a new initialize",
        budget={},
        measured={},
        evidence=evidence,
        violations=violations,
    )


def test_only_fault_evidence_missing_is_not_applicable_and_says_why() -> None:
    r = waive(result(EVENTS, FROM_FAULTS), REGISTRY["missing_rehandshake"])
    assert r.verdict is Verdict.NOT_APPLICABLE
    assert r.summary.startswith("not applicable: a capacity check injects no faults by design")
    assert "404s to requests with a session: none" in r.summary


def test_gate_1_judges_without_its_injected_crossings() -> None:
    crossings = Evidence("stream crossings injected", 1, 0, False, from_faults=True)
    checked = Evidence("accepted messages checked", 1, 4_000, True)
    r = waive(result(EVENTS, crossings, checked), REGISTRY["cross_stream"])
    assert r.verdict is Verdict.PASS and "not required here (stream crossings injected)" in r.notes[-1]
    # The same gate with a violation found fails, capacity check or not.
    failed = result(EVENTS, crossings, checked, violations=3)
    assert waive(failed, REGISTRY["cross_stream"]).verdict is Verdict.FAIL


def test_other_missing_evidence_stays_inconclusive() -> None:
    few = replace(EVENTS, observed=50, ok=False)
    for evidence in ((few, FROM_FAULTS), (Evidence("lab not saturated", True, False, False), FROM_FAULTS)):
        r = result(*evidence)
        assert waive(r, REGISTRY["missing_rehandshake"]) == r
    broken = replace(result(EVENTS, FROM_FAULTS), error="KeyError: 'x'")
    assert waive(broken, REGISTRY["missing_rehandshake"]) == broken
    passed = result(EVENTS)
    assert waive(passed, REGISTRY["missing_rehandshake"]) == passed


def test_declared_reads_run_json() -> None:
    assert declared({"scenario": {"check": "capacity"}})
    assert not declared({"scenario": {"check": "gates"}}) and not declared({}) and not declared(None)
    assert not declared({"scenario": "capacity"})
