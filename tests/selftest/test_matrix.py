"""How `lab selftest` judges a run and chooses its exit code (no I/O: report.json contents
given in memory, shaped as `lab report` writes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.exitcodes import ExitCode
from lab.selftest.cases import BY_NAME, CASES, PRISTINE, select
from lab.selftest.execute import CaseRun
from lab.selftest.matrix import GATES, Outcome, as_json, exit_code, judge_case, markdown, text_matrix
from lab.server.defects import DEFECT_NAMES


def report(
    verdict: str, gates: dict[int, tuple[str, dict[str, int], list[tuple[str, str]]]]
) -> dict[str, Any]:
    """A report.json: every gate passes unless `gates` says (number -> verdict, counts,
    [(check, attribution)] of its witnesses)."""
    out = []
    for number, name in GATES:
        v, counts, witnesses = gates.get(number, ("pass", {}, []))
        out.append(
            {
                "number": number,
                "gate": name,
                "verdict": v,
                "attribution_counts": counts,
                "witnesses": [{"check": c, "attribution": a, "explanation": "..."} for c, a in witnesses],
            }
        )
    return {"schema": "mcpLabReport.v2", "verdict": verdict, "rules": {g["gate"]: g for g in out}}


def run(case: str, code: int | None, doc: dict[str, Any] | None, error: str | None = None) -> CaseRun:
    return CaseRun(BY_NAME[case], code, 30.0, Path("/r") / case, doc, error)


def test_every_defect_of_the_server_has_a_case_with_a_gate_and_checks() -> None:
    assert {c.name for c in CASES} == {PRISTINE, *DEFECT_NAMES}
    for c in CASES:
        if c.defect is not None:
            assert c.gate in dict(GATES) and c.checks and c.why, c.name
    assert [c.name for c in select(["no-priming", PRISTINE])] == [PRISTINE, "no-priming"]
    with pytest.raises(ValueError, match=r"unknown case.*bogus"):
        select(["bogus"])


def test_a_defect_is_caught_only_by_a_server_witness_of_an_expected_check_in_its_gate() -> None:
    hit = report("fail", {1: ("fail", {"server": 3}, [("sent_off_home", "server")])})
    assert judge_case(run("shared-event-store", 1, hit)).outcome is Outcome.CAUGHT
    # The gate failed, but only on the client: the detector of the defect did not fire.
    client_only = report("fail", {1: ("fail", {"client": 2}, [("not_sent_on_stream", "client")])})
    row = judge_case(run("shared-event-store", 1, client_only))
    assert row.outcome is Outcome.MISSED and "no server witness of sent_off_home" in row.why
    # A server witness of another check does not count either.
    other = report("fail", {1: ("fail", {"server": 1}, [("replayed_before_cursor", "server")])})
    assert judge_case(run("shared-event-store", 1, other)).outcome is Outcome.MISSED
    # Another gate failing is no catch.
    elsewhere = report("fail", {2: ("fail", {"server": 5}, [("wire_different_results", "server")])})
    assert judge_case(run("shared-event-store", 1, elsewhere)).outcome is Outcome.MISSED
    # The expected gate could not be decided: undecided, not missed.
    thin = report("inconclusive", {1: ("inconclusive", {}, [])})
    assert judge_case(run("shared-event-store", 2, thin)).outcome is Outcome.UNDECIDED


def test_the_pristine_run_passes_only_when_lab_run_passed() -> None:
    assert judge_case(run(PRISTINE, 0, report("pass", {}))).outcome is Outcome.PASSED
    alarm = report("fail", {5: ("fail", {"unattributed": 1}, [("slow_recovery", "unattributed")])})
    row = judge_case(run(PRISTINE, 1, alarm))
    assert row.outcome is Outcome.FALSE_ALARM and "resume_p99" in row.why
    thin = judge_case(run(PRISTINE, 2, report("inconclusive", {3: ("inconclusive", {}, [])})))
    assert thin.outcome is Outcome.UNDECIDED and "missing_rehandshake" in thin.why


def test_runs_that_were_not_made_or_whose_lab_failed() -> None:
    assert judge_case(run(PRISTINE, 3, None)).outcome is Outcome.NOT_MADE
    assert (
        judge_case(run(PRISTINE, None, None, "lab serve exited with 3: cannot bind")).outcome
        is Outcome.NOT_MADE
    )
    assert judge_case(run(PRISTINE, 4, None)).outcome is Outcome.LAB_FAILED
    assert judge_case(run(PRISTINE, 1, None, "no report")).outcome is Outcome.LAB_FAILED
    assert judge_case(run(PRISTINE, None, None)).outcome is Outcome.NOT_RUN
    # The reference server died during the run: whatever the report says, the lab failed.
    crashed = run(PRISTINE, 0, report("pass", {}), "lab serve exited with 4 (see serve.log)")
    assert judge_case(crashed).outcome is Outcome.LAB_FAILED


def test_the_exit_code_is_the_worst_outcome_in_the_documented_order() -> None:
    caught = judge_case(
        run("any-origin", 1, report("fail", {4: ("fail", {"server": 1}, [("not_rejected", "server")])}))
    )
    passed = judge_case(run(PRISTINE, 0, report("pass", {})))
    missed = judge_case(run("no-priming", 0, report("pass", {})))
    undecided = judge_case(run("no-priming", 2, report("inconclusive", {5: ("inconclusive", {}, [])})))
    not_made = judge_case(run("no-retry-field", 3, None))
    lab_failed = judge_case(run("no-retry-field", 4, None))
    assert exit_code([passed, caught]) is ExitCode.PASS
    assert exit_code([passed, caught, undecided]) is ExitCode.INCONCLUSIVE
    assert exit_code([passed, undecided, not_made]) is ExitCode.CANNOT_RUN
    assert exit_code([passed, not_made, missed]) is ExitCode.GATE_FAILED
    assert exit_code([missed, lab_failed]) is ExitCode.LAB_FAILED
    assert exit_code([]) is ExitCode.INCONCLUSIVE


def test_the_matrix_marks_the_expected_cell_and_the_server_counts(tmp_path: Path) -> None:
    hit = report(
        "fail",
        {
            1: ("fail", {"server": 12, "client": 1}, [("sent_off_home", "server")]),
            2: ("fail", {"server": 3}, [("wire_different_results", "server")]),
        },
    )
    rows = [judge_case(run(PRISTINE, 0, report("pass", {}))), judge_case(run("shared-event-store", 1, hit))]
    text = text_matrix(rows)
    line = next(x for x in text.splitlines() if x.startswith("shared-event-store"))
    assert "FAIL s12*" in line and "FAIL s3 " in line and "caught" in line
    md = markdown(rows, wall_s=61.0, code=0, event_ids="seq", scenario="selftest")
    assert "| shared-event-store | 1 sent_off_home | FAIL s12* |" in md
    doc = as_json(
        rows, started_at=1.0, wall_s=61.0, code=0, event_ids="seq", scenario="selftest", folder=Path("/r")
    )
    case = doc["cases"][1]
    assert case["outcome"] == "caught" and case["expected"] == {
        "gate": 1,
        "gate_name": "cross_stream",
        "checks": ["sent_off_home"],
        "attribution": "server",
    }
    assert case["gates"][0] == {
        "number": 1,
        "gate": "cross_stream",
        "verdict": "fail",
        "server_violations": 12,
        "server_checks": ["sent_off_home"],
    }
    assert case["run_dir"] == "shared-event-store"


class ScriptedSelftest:
    """`Selftest._case` with each try's CaseRun taken from a script instead of a real `lab
    run`: which outcome a real run has on a busy machine cannot be chosen, and the rule
    under test is only which outcomes are tried again (the live selftest tests run it for
    real)."""

    @staticmethod
    def tries(script: list[CaseRun], retries: int) -> tuple[Any, list[int]]:
        from lab.scenario import load_scenario
        from lab.selftest.session import Selftest

        attempts: list[int] = []

        class Scripted(Selftest):
            def _one(self, case: Any, folder: Path, *, attempt: int) -> CaseRun:
                attempts.append(attempt)
                return script[attempt - 1]

            def say(self, text: str, *, err: bool = False) -> None:
                pass

        st = Scripted(
            [], load_scenario("selftest"), out=Path("/nowhere"), jobs=1, event_ids="seq", retries=retries
        )
        return st._case(script[0].case, Path("/nowhere")), attempts


def test_an_undecided_case_is_tried_again_and_a_decided_one_never() -> None:
    undecided = run(PRISTINE, 2, report("inconclusive", {5: ("inconclusive", {"server": 1}, [])}))
    passed = run(PRISTINE, 0, report("pass", {}))
    row, attempts = ScriptedSelftest.tries([undecided, passed], retries=1)
    assert attempts == [1, 2] and row.outcome is Outcome.PASSED
    assert [e.outcome for e in row.earlier] == [Outcome.UNDECIDED]
    assert row.outcome_text == "passed (try 2)" and row.seconds == 60.0
    assert (
        row.why_text.startswith("try 1 undecided: run verdict inconclusive")
        and "try 2: every gate" in row.why_text
    )
    doc = as_json(
        [row], started_at=0.0, wall_s=60.0, code=0, event_ids="seq", scenario="selftest", folder=Path("/r")
    )
    (case,) = doc["cases"]
    assert case["outcome"] == "passed" and [e["outcome"] for e in case["earlier_tries"]] == ["undecided"]
    assert "passed (try 2)" in text_matrix([row])
    # Never tried again: --retries 0, a false alarm, a caught defect; and at most `retries` more tries.
    row, attempts = ScriptedSelftest.tries([undecided, passed], retries=0)
    assert attempts == [1] and row.outcome is Outcome.UNDECIDED and not row.earlier
    alarm = run(PRISTINE, 1, report("fail", {5: ("fail", {"server": 1}, [("slow_recovery", "server")])}))
    row, attempts = ScriptedSelftest.tries([alarm, passed], retries=2)
    assert attempts == [1] and row.outcome is Outcome.FALSE_ALARM
    row, attempts = ScriptedSelftest.tries([undecided, undecided, undecided, passed], retries=2)
    assert attempts == [1, 2, 3] and row.outcome is Outcome.UNDECIDED and len(row.earlier) == 2
