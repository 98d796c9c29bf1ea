"""`lab run` on a timeline, every part real: a recovery phase that keeps its storm on
fails gate 7; a rollout passes gate 8, and the same rollout with a rollback that drops
the old cursor index fails it."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from lab.report.document import rules_of
from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live
HERE = Path(__file__).resolve().parent


def lab_run(scenario: Path, out: Path) -> tuple[int, dict[str, Any], Path]:
    proc = subprocess.run(
        [LAB, "run", str(scenario), "--out", str(out), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    return proc.returncode, report, folder


def gate(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in rules_of(report) if g["gate"] == name)
    return found


@pytest.mark.long
def test_a_recovery_phase_that_keeps_the_storm_on_fails_gate_7(tmp_path: Path) -> None:
    code, report, folder = lab_run(HERE / "storm-kept.toml", tmp_path / "results")
    g7 = gate(report, "steady_state")
    (recovery,) = g7["measured"]["phases"]
    assert recovery["phase"] == "recovery" and "events_per_s" in recovery["missed"], recovery
    if recovery["limited_by_lab"]:
        # A box busy with other work (e.g. the rest of the suite in parallel) saturates the
        # lab's processes: the miss is then not the target's, and the gate says so.
        assert g7["verdict"] == "inconclusive" and code in (1, 2), g7["summary"]
        assert "limited by the lab" in g7["summary"]
    else:
        assert code == 1 and report["verdict"] == "fail" and g7["verdict"] == "fail", g7["summary"]
        assert {w["row"]["phase"] for w in g7["witnesses"]} == {"recovery"}
        assert "events_per_s" in {w["row"]["metric"] for w in g7["witnesses"]}
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["storm"]["status_4xx"] > 0 and phases["recovery"]["status_4xx"] > 0  # 429s, still
    assert phases["storm"]["knobs"] == {"max_rps": 3}
    # Every report shows the lab's processes, from processes.jsonl.
    parts = {p["part"] for p in report["processes"]["parts"]}
    assert {"server", "mitmproxy", "nemesis", "master", "worker-0", "lab-run"} <= parts
    assert "## Phases" in (folder / "report.md").read_text() and (folder / "fig-processes.png").is_file()
    assert '<h2 id="phases">' in (folder / "report.html").read_text()
    junit = ET.parse(folder / "junit.xml").getroot()
    (case,) = [c for c in junit.iter("testcase") if c.get("name") == "7 steady_state"]
    # Gate 7's own test case fails exactly when gate 7 does (gate 5 may fail beside it: the
    # server's own 429s and their Retry-After are its share of every recovery).
    failed = [f for f in case.iter("failure") if f.get("type") == "gate_failed"]
    assert bool(failed) is (g7["verdict"] == "fail")


@pytest.mark.long
def test_a_rollback_that_drops_the_old_cursor_index_fails_gate_8(tmp_path: Path) -> None:
    """The unacceptable rollback, end to end. (The checks pass on the documented rollback:
    tests/phases/test_rollout_gate.py on built ledgers, and `lab run rollout`.) Every
    other check still has its evidence here: the probe and the knobs did their part."""
    scenario = tmp_path / "rollout-mini.toml"
    text = (HERE / "rollout-mini.toml").read_text(encoding="utf-8")
    scenario.write_text(text.replace('rollback = "keep-index"', 'rollback = "drop-index"'), encoding="utf-8")
    code, report, folder = lab_run(scenario, tmp_path / "results")
    g8 = gate(report, "rollout")
    checks = {c["check"]: c for c in report["rollout"]["checks"]}
    assert code == 1 and g8["verdict"] == "fail", g8["summary"]
    assert checks["old_cursors_resume"]["violations"] >= 1
    assert {w["check"] for w in g8["witnesses"]} == {"old_cursors_resume"}
    assert all("other_generation" in w["explanation"] for w in g8["witnesses"])
    for name in ("cross_stream", "resumable_share", "new_streams_not_resumable", "expired_cursors_rejected"):
        assert checks[name]["violations"] == 0, checks[name]
        assert all(e["ok"] for e in checks[name]["evidence"]), checks[name]["evidence"]
    probe = [json.loads(line) for line in (folder / "phases.jsonl").read_text().splitlines()]
    moves = {r["action"]: r for r in probe if r["type"] == "probe"}
    assert moves["resume_old_cursor"]["status"] == 400 and moves["resume_expired_cursor"]["status"] == 404
