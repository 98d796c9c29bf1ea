"""Rules by protocol era: a rule that does not exist in the era(s) a run tested is not
applicable (never a pass nor a fail, and nothing in the run's verdict); the run's eras
come from run.json `target.era`, else from the wire (docs/eras.md)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import RunReport, Verdict
from lab.checker.rules import REGISTRY
from lab.report.document import document as report_document
from lab.report.junit import render as junit
from lab.report.markdown import gate_table
from tests.checker.builders import clean_run

HANDSHAKE_ONLY = {
    "missing_rehandshake",
    "client_resume_cursor",
    "client_reconnect_after_gone",
    "client_disconnect_cancel",
    "session_routing",
}


def _judged(
    tmp_path: Path, era: str | None = None, versions: tuple[str | None, ...] | None = None
) -> RunReport:
    """The clean run (every rule passes in it), its era said in run.json, or its flows'
    revisions on the wire set to `versions` (in turn)."""
    sim = clean_run().sim
    run_dir = sim.write(tmp_path / f"run-{era}-{versions}")
    if era is not None:
        run = json.loads((run_dir / "run.json").read_text())
        run["target"]["era"] = era
        (run_dir / "run.json").write_text(json.dumps(run))
    if versions is not None:
        tap = [json.loads(line) for line in (run_dir / "proxy" / "tap.jsonl").read_text().splitlines()]
        flows = [r for r in tap if r["type"] == "flow"]
        for i, r in enumerate(flows):
            r["protocol_version_in"] = versions[i % len(versions)]
        (run_dir / "proxy" / "tap.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tap))
    return judge_dir(run_dir)[1]


def _verdicts(report: RunReport) -> dict[str, Verdict]:
    return {g.gate: g.verdict for g in report.gates}


def test_the_rules_of_sessions_and_resumption_are_declared_of_the_handshake_era_only() -> None:
    assert {r.id for r in REGISTRY if r.eras == frozenset({"handshake"})} == HANDSHAKE_ONLY
    assert all(r.era_note for r in REGISTRY if r.eras != frozenset({"handshake", "modern"}))


def test_a_modern_run_shows_the_handshake_rules_not_applicable_and_judges_the_rest(tmp_path: Path) -> None:
    handshake, modern = _verdicts(_judged(tmp_path, "handshake")), _judged(tmp_path, "modern")
    by_gate = {g.gate: g for g in modern.gates}
    # Every rule is shown, and the modern era's own (check 15) only in a run of that era.
    assert set(by_gate) == set(handshake) | {"modern_requests"} and "modern_requests" not in handshake
    for gate, result in by_gate.items():
        if gate == "modern_requests":
            continue
        if gate in HANDSHAKE_ONLY:
            assert result.verdict is Verdict.NOT_APPLICABLE, gate
            assert "the modern era (2026-07-28)" in result.summary and result.violations == 0
        else:
            assert result.verdict is handshake[gate], gate
    # Not applicable counts for nothing: the verdict is the judged rules'. (Check 15, the
    # modern era's own, has no mismatched header to judge in this hand-made run.)
    assert {g.gate for g in modern.gates if g.verdict is not Verdict.PASS} == HANDSHAKE_ONLY & set(
        by_gate
    ) | {"modern_requests"}
    assert by_gate["modern_requests"].verdict is Verdict.INCONCLUSIVE


@pytest.mark.parametrize("era", ["handshake", "both"])
def test_a_run_of_the_handshake_era_judges_every_rule(tmp_path: Path, era: str) -> None:
    assert Verdict.NOT_APPLICABLE not in _verdicts(_judged(tmp_path, era)).values()


@pytest.mark.parametrize(
    ("versions", "not_applicable"),
    [
        (("2026-07-28",), True),  # every flow of the modern era
        (("2026-07-28", None), False),  # both eras on the wire
        ((None, "2025-11-25"), False),
    ],
)
def test_without_run_json_saying_the_eras_come_from_the_wire(
    tmp_path: Path, versions: tuple[str | None, ...], not_applicable: bool
) -> None:
    verdicts = _verdicts(_judged(tmp_path, None, versions))
    assert (verdicts["missing_rehandshake"] is Verdict.NOT_APPLICABLE) is not_applicable


def test_not_applicable_reads_as_such_in_the_markdown_and_junit(tmp_path: Path) -> None:
    report = _judged(tmp_path, "modern")
    shown = sum(1 for g in report.gates if g.verdict is Verdict.NOT_APPLICABLE)
    assert shown >= 1
    doc = report_document(report)
    assert "| 3 | 404 without a new handshake | **N/A** | not applicable: the run tested" in gate_table(doc)
    suite = ET.fromstring(junit(doc)).find("testsuite")
    assert suite is not None and suite.get("skipped") == str(shown)
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert len(skipped) == shown


def test_in_a_run_of_both_eras_a_rule_of_one_era_says_whose_clients_it_judged(tmp_path: Path) -> None:
    both = {g.gate: g for g in _judged(tmp_path, "both").gates}
    (note,) = [n for n in both["missing_rehandshake"].notes if n.startswith("a rule of")]
    assert note.startswith("a rule of the handshake era") and "no session is lost" in note
    assert not [n for n in both["cross_stream"].notes if n.startswith("a rule of")]
    handshake = {g.gate: g for g in _judged(tmp_path, "handshake").gates}
    assert not [n for n in handshake["missing_rehandshake"].notes if n.startswith("a rule of")]


def test_in_a_run_of_both_eras_gate_5_gives_its_p99_per_era(tmp_path: Path) -> None:
    both = {g.gate: g for g in _judged(tmp_path, "both").gates}["resume_p99"]
    by_era: Any = both.measured["by_era"]
    assert isinstance(by_era, dict) and set(by_era) == {"handshake", "modern"}
    assert sum(int(r["recoveries"]) for r in by_era.values()) == both.measured["recoveries"]
    assert any(n.startswith("by era (resumptions in the handshake era") for n in both.notes)
    one = {g.gate: g for g in _judged(tmp_path, "handshake").gates}["resume_p99"]
    assert one.measured["by_era"] is None
