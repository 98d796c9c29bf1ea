"""`lab run` on a timeline, every part real: a recovery phase that keeps its storm on
fails gate 7; a rollout passes gate 8, and the same rollout with a rollback that drops
the old cursor index fails it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

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
    found: dict[str, Any] = next(g for g in report["gates"] if g["gate"] == name)
    return found


def test_a_recovery_phase_that_keeps_the_storm_on_fails_gate_7(tmp_path: Path) -> None:
    code, report, folder = lab_run(HERE / "storm-kept.toml", tmp_path / "results")
    g7 = gate(report, "steady_state")
    assert code == 1 and report["verdict"] == "fail" and g7["verdict"] == "fail", g7["summary"]
    assert {w["row"]["phase"] for w in g7["witnesses"]} == {"recovery"}
    assert "events_per_s" in {w["row"]["metric"] for w in g7["witnesses"]}
    phases = {p["name"]: p for p in report["phases"]}
    assert phases["storm"]["status_4xx"] > 0 and phases["recovery"]["status_4xx"] > 0  # 429s, still
    assert phases["storm"]["knobs"] == {"max_rps": 8}
    # Every report shows the lab's processes, from processes.jsonl.
    parts = {p["part"] for p in report["processes"]["parts"]}
    assert {"server", "mitmproxy", "nemesis", "master", "worker-0", "lab-run"} <= parts
    assert "## Phases" in (folder / "report.md").read_text() and (folder / "fig-processes.png").is_file()
    assert '<h2 id="phases">' in (folder / "report.html").read_text()
    junit = (folder / "junit.xml").read_text()
    assert 'name="7 steady_state"' in junit and "gate_failed" in junit


@pytest.mark.parametrize("rollback", ["keep-index", "drop-index"])
def test_rollout_gate_passes_and_catches_a_rollback_that_drops_the_index(
    tmp_path: Path, rollback: str
) -> None:
    scenario = tmp_path / "rollout-mini.toml"
    text = (HERE / "rollout-mini.toml").read_text(encoding="utf-8")
    scenario.write_text(text.replace('rollback = "keep-index"', f'rollback = "{rollback}"'), encoding="utf-8")
    _, report, folder = lab_run(scenario, tmp_path / "results")
    g8 = gate(report, "rollout")
    checks = {c["check"]: c for c in report["rollout"]["checks"]}
    assert set(checks) == {
        "cross_stream",
        "resumable_share",
        "old_cursors_resume",
        "new_streams_not_resumable",
        "expired_cursors_rejected",
    }
    probe = [json.loads(line) for line in (folder / "phases.jsonl").read_text().splitlines()]
    assert {r.get("action") for r in probe if r["type"] == "probe"} >= {"open", "resume_old_cursor"}
    if rollback == "keep-index":
        assert g8["verdict"] == "pass", (g8["summary"], [e for e in g8["evidence"] if not e["ok"]])
        assert all(c["violations"] == 0 for c in checks.values())
    else:
        assert g8["verdict"] == "fail" and checks["old_cursors_resume"]["violations"] >= 1
        assert any(w["check"] == "old_cursors_resume" for w in g8["witnesses"])
        assert checks["new_streams_not_resumable"]["violations"] == 0
