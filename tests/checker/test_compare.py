"""`lab compare`: what counts as a regression between two report.json documents, and the
command's refusals. Live, on real runs: tests/selftest/test_selftest_live.py (the pristine
run against a legal shape, and against defects)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from lab.cli import main
from lab.exitcodes import ExitCode
from lab.report.cli import parse_tolerance
from lab.report.compare import compare


def report(**rules: tuple[str, int]) -> dict[str, Any]:
    """A report.json with the figures `compare` reads (the fields `lab report` writes)."""
    doc: dict[str, Any] = {
        "verdict": "pass",
        "incomplete": False,
        "event_count": 10_000,
        "run": {
            "run_id": "r",
            "scenario": "smoke",
            "target": "reference",
            "seed": 1,
            "complete": True,
            "duration_s": 10.0,
        },
        "rules": {
            "resume_p99": {
                "number": 5,
                "title": "Resume latency p99",
                "verdict": "pass",
                "summary": "p99 1 s",
                "violations": 0,
                "measured": {
                    "recoveries": 100,
                    "shares": {"target": {"p99_s": 0.2}, "total": {"p99_s": 1.0}},
                },
            }
        },
        "phases": [{"calls": 200, "call_errors": 4, "reconnect_qps_peak": 5}],
        "processes": {"parts": [{"role": "lab", "cpu_mean": 0.5}, {"role": "target", "cpu_mean": 0.2}]},
    }
    for name, (verdict, violations) in rules.items():
        doc["rules"][name] = {
            "number": 1,
            "title": name,
            "verdict": verdict,
            "summary": f"{name} said so",
            "violations": violations,
        }
    return doc


def test_the_same_figures_are_no_regression() -> None:
    base = report(cross_stream=("pass", 0))
    result = compare(base, copy.deepcopy(base))
    assert result.exit_code == ExitCode.PASS and result.headline == "no regression"
    assert not result.regressions and not result.weaker


@pytest.mark.parametrize(
    ("before", "after", "code", "said"),
    [
        (("pass", 0), ("fail", 3), ExitCode.GATE_FAILED, "cross_stream: PASS -> FAIL (cross_stream said so)"),
        (("inconclusive", 0), ("fail", 1), ExitCode.GATE_FAILED, "cross_stream: INCONCLUSIVE -> FAIL"),
        (("fail", 2), ("fail", 9), ExitCode.GATE_FAILED, "cross_stream: still FAIL, violations 2 -> 9"),
        (("pass", 0), ("inconclusive", 0), ExitCode.INCONCLUSIVE, "cross_stream: PASS -> INCONCLUSIVE"),
        (("fail", 3), ("pass", 0), ExitCode.PASS, ""),
        (("fail", 5), ("fail", 2), ExitCode.PASS, ""),
    ],
)
def test_a_rule_that_got_worse_is_named(
    before: tuple[str, int], after: tuple[str, int], code: ExitCode, said: str
) -> None:
    result = compare(report(cross_stream=before), report(cross_stream=after))
    assert result.exit_code == code
    named = result.regressions + result.weaker
    assert (said in " ".join(named)) if said else not named, named


def test_the_targets_resume_share_counts_beyond_the_tolerance_and_the_floor() -> None:
    base = report()
    slower = copy.deepcopy(base)
    slower["rules"]["resume_p99"]["measured"]["shares"]["target"]["p99_s"] = (
        0.28  # +40 %, +0.08 s: under the floor
    )
    assert compare(base, slower).exit_code == ExitCode.PASS
    slower["rules"]["resume_p99"]["measured"]["shares"]["target"]["p99_s"] = 6.1
    result = compare(base, slower)
    assert result.exit_code == ExitCode.GATE_FAILED
    assert result.regressions == ["resume p99, the target's share (s) 0.200 -> 6.100"]
    # The lab's or the client's share alone (the total) is shown, never judged.
    lab_slow = copy.deepcopy(base)
    lab_slow["rules"]["resume_p99"]["measured"]["shares"]["total"]["p99_s"] = 9.0
    assert compare(base, lab_slow).exit_code == ExitCode.PASS


def test_throughput_and_call_errors_beyond_the_tolerance() -> None:
    base = report()
    slow = copy.deepcopy(base)
    slow["event_count"] = 7_000  # -30 % events per second over the same 10 s
    assert compare(base, slow).regressions == ["events per second 1,000 -> 700"]
    assert compare(base, slow, tolerance=0.5).exit_code == ExitCode.PASS
    failing = copy.deepcopy(base)
    failing["phases"][0]["call_errors"] = 30  # 2 % -> 15 % of calls
    assert compare(base, failing).regressions == ["call error rate 0.020 -> 0.150"]


def test_an_unfinished_run_makes_the_comparison_weaker_and_different_runs_are_noted() -> None:
    base, new = report(), report()
    new["incomplete"] = True
    new["run"]["end_reason"] = "interrupted"
    new["run"]["target"] = "http://127.0.0.1:9/mcp"
    result = compare(base, new)
    assert result.exit_code == ExitCode.INCONCLUSIVE
    assert result.weaker == ["the new run did not finish (interrupted)"]
    assert result.notes == ["the runs have different targets (reference vs http://127.0.0.1:9/mcp)"]


def write_run(folder: Path, doc: dict[str, Any]) -> Path:
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(doc), encoding="utf-8")
    return folder


def test_the_command_prints_the_table_and_json_and_exits_by_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run(tmp_path / "base", report(cross_stream=("pass", 0)))
    new = write_run(tmp_path / "new", report(cross_stream=("fail", 4)))
    assert main(["compare", str(base), str(base)]) == ExitCode.PASS
    assert capsys.readouterr().out.splitlines()[-1] == "no regression"
    assert main(["compare", str(base), str(new)]) == ExitCode.GATE_FAILED
    out = capsys.readouterr().out
    assert "REGRESSED" in out.splitlines()[-1] and "cross_stream: PASS -> FAIL" in out
    assert main(["compare", "--json", str(base), str(new)]) == ExitCode.GATE_FAILED
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "regressed" and doc["exit_code"] == 1


def test_a_folder_without_a_report_or_a_bad_tolerance_is_3_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_run(tmp_path / "base", report())
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(base), str(tmp_path / "empty")]) == ExitCode.CANNOT_RUN
    assert "no report.json" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text("{not json", encoding="utf-8")
    assert main(["compare", str(base), str(tmp_path / "bad")]) == ExitCode.CANNOT_RUN
    assert "not a readable report.json" in capsys.readouterr().err
    assert main(["compare", "--tolerance", "lots", str(base), str(base)]) == ExitCode.CANNOT_RUN
    assert "expected a share like 25% or 0.25" in capsys.readouterr().err


def test_tolerance_is_a_share_or_a_percentage() -> None:
    assert parse_tolerance("25%") == 0.25 and parse_tolerance("0.1") == 0.1
    with pytest.raises(ValueError, match="between 0% and 1000%"):
        parse_tolerance("-5%")


def test_figures_are_not_judged_across_scenarios_but_rules_are() -> None:
    base = report(cross_stream=("pass", 0))
    other = report(cross_stream=("pass", 0))
    other["run"]["scenario"] = "storm"
    other["event_count"] = 2_000  # another load shape, another rate
    result = compare(base, other)
    assert result.exit_code == ExitCode.PASS, result.regressions
    assert "the figures are shown, not judged: the runs are of different scenarios" in result.notes
    other["rules"]["cross_stream"]["verdict"] = "fail"
    assert compare(base, other).regressions == ["rule 1 cross_stream: PASS -> FAIL (cross_stream said so)"]
