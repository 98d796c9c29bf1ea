"""The rule registry is the one list of rules: a toy rule registered there, and nowhere
else, is judged and shows in report.json, report.md and junit.xml; a taken ID or number is
refused by name; every rule of the lab keeps its stable ID and a unique number."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab.checker import REGISTRY, Audience, Rule
from lab.checker.context import Context
from lab.checker.model import Attribution, Evidence, GateResult, Verdict, Witness
from lab.checker.rules.base import Registry, RuleError
from lab.report.outputs import report_run
from tests.checker.builders import clean_run

TOY_ID = "toy_event_parity"


def toy_check(ctx: Context) -> GateResult:
    """Fails when the run's event count is odd: a rule that reads one measure and judges."""
    count, _ = ctx.event_count()
    odd = count is not None and count % 2 == 1
    return GateResult(
        verdict=Verdict.FAIL if odd else Verdict.PASS,
        summary=f"{count} events: {'odd' if odd else 'even'}",
        budget={},
        measured={"events": count},
        evidence=(Evidence("events", 1, count, bool(count), ""),),
        violations=int(odd),
        witnesses=(Witness("odd_count", f"{count} events is odd", Attribution.SERVER, {"events": count}),)
        if odd
        else (),
        attribution_counts={"server": int(odd)},
    )


TOY = Rule(
    id=TOY_ID,
    number=99,
    title="Toy: an even number of events",
    blames=(Attribution.SERVER,),
    evidence="the run's event count",
    check=toy_check,
)


def _report(run_dir: Path) -> int:
    out, err = io.StringIO(), io.StringIO()
    return report_run(run_dir, witness_limit=5, figures=False, quiet=True, out=out, err=err)


def test_a_rule_registered_alone_is_judged_and_shown_in_every_output(tmp_path: Path) -> None:
    run_dir = clean_run().sim.write(tmp_path / "run")
    assert _report(run_dir) == 0
    before = json.loads((run_dir / "report.json").read_text())
    assert TOY_ID not in before["rules"]
    events = before["event_count"]
    with REGISTRY.registered(TOY):
        code = _report(run_dir)
    doc = json.loads((run_dir / "report.json").read_text())
    toy = doc["rules"][TOY_ID]
    assert toy["number"] == 99 and toy["gate"] == TOY_ID and toy["title"] == TOY.title
    assert toy["measured"] == {"events": events}
    assert list(doc["rules"])[-1] == TOY_ID  # display order: by number
    odd = events % 2 == 1
    assert toy["verdict"] == ("fail" if odd else "pass") and code == (1 if odd else 0)
    md = (run_dir / "report.md").read_text()
    assert f"| 99 | {TOY.title} |" in md
    suite = ET.parse(run_dir / "junit.xml").getroot()
    names = [case.get("name") or "" for case in suite.iter("testcase")]
    assert any(TOY_ID in n or TOY.title in n for n in names), names
    # Gone with the block: the registry is the only list.
    assert _report(run_dir) == 0
    assert TOY_ID not in json.loads((run_dir / "report.json").read_text())["rules"]


def test_a_toy_rule_that_fails_fails_the_run(tmp_path: Path) -> None:
    def always_fails(ctx: Context) -> GateResult:
        return GateResult(verdict=Verdict.FAIL, summary="toy", budget={}, measured={}, violations=1)

    run_dir = clean_run().sim.write(tmp_path / "run")
    with REGISTRY.registered(Rule("toy_fails", 98, "Toy that fails", (), "", check=always_fails)):
        assert _report(run_dir) == 1
    assert _report(run_dir) == 0


def test_a_taken_id_or_number_is_refused_by_name() -> None:
    with pytest.raises(RuleError, match=r"rule ID 'cross_stream' is already registered \(gate 1\)"):
        REGISTRY.register(Rule("cross_stream", 97, "x", (), "", check=toy_check))
    with pytest.raises(RuleError, match=r"number 5 is already rule 'resume_p99'"):
        REGISTRY.register(Rule("fresh_id", 5, "x", (), "", check=toy_check))
    with pytest.raises(RuleError, match="judges no one"):
        Registry().register(Rule("nobody", 1, "x", (), "", check=None))
    with pytest.raises(RuleError, match="letters, digits and underscores"):
        Registry().register(Rule("has space", 1, "x", (), "", check=toy_check))
    assert "fresh_id" not in REGISTRY.ids()


def test_every_rule_of_the_lab_has_its_stable_id_and_audience() -> None:
    assert REGISTRY.ids() == (
        "cross_stream",
        "duplicate_dispatch",
        "missing_rehandshake",
        "illegal_origin",
        "resume_p99",
        "reconnect_qps",
        "steady_state",
        "rollout",
        "client_resume_cursor",
        "client_reconnect_after_gone",
        "client_disconnect_cancel",
        "client_resend",
        "declared_capabilities",
        "session_routing",
        "modern_requests",
        "capacity",
    )
    assert [r.number for r in REGISTRY] == list(range(1, 17))
    lab = {r.id for r in REGISTRY.for_audience(Audience.LAB)}
    sut = {r.id for r in REGISTRY.for_audience(Audience.UNDER_TEST)}
    assert lab == {
        *REGISTRY.ids()[:8],
        "declared_capabilities",
        "session_routing",
        "modern_requests",
        "capacity",
    } and sut == set(REGISTRY.ids()) - {"capacity"}
    assert [r.id for r in REGISTRY.core()] == list(REGISTRY.ids()[:6])
