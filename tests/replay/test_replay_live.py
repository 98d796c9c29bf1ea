"""`lab replay` with every real part: a run against a server with a deliberate defect
fails gate 1; its replay (the same clients scripted, every fault pinned to its trigger,
against the same server, which has lived on meanwhile) fails it again with the same
culprit, and says how many of the recorded triggers fired again. What cannot be
replayed is refused with exit 3 before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB, ROOT, reference_server

pytestmark = pytest.mark.live


def lab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LAB, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def only_run(root: Path) -> Path:
    (folder,) = sorted(p for p in root.iterdir() if p.is_dir() and (p / "run.json").exists())
    return folder


def test_a_failing_run_replayed_fails_the_same_rule_with_the_same_culprit(tmp_path: Path) -> None:
    with reference_server(tmp_path, "--defect", "replay-other-streams", ledger=False) as server:
        first = lab("run", "scenarios/selftest.toml", "--target", server.url, "--out", str(tmp_path / "runs"),
                    "--quiet", "--no-figures")  # fmt: skip
        assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-2000:]
        original = only_run(tmp_path / "runs")
        rules = json.loads((original / "report.json").read_text())["rules"]
        assert rules["cross_stream"]["verdict"] == "fail"
        again = lab("replay", str(original), "--out", str(tmp_path / "replays"), "--quiet")
    out = again.stdout + again.stderr
    assert again.returncode == 1, out[-3000:]  # the replay's own verdict: a gate failed
    replay = only_run(tmp_path / "replays")
    doc = json.loads((replay / "replay.json").read_text())
    assert doc["schema"] == "mcpLabReplay.v1" and doc["original"] == original.name
    (cross,) = [r for r in doc["rules"] if r["rule"] == "cross_stream"]
    assert cross["same"] and cross["replay"] == {"verdict": "fail", "culprit": "server"}, doc["rules"]
    assert doc["reproduced"], out[-3000:]
    triggers = doc["triggers"]
    recorded = sum(1 for _ in (original / "fault_triggers.jsonl").open())
    assert triggers["recorded"] == recorded > 0 and triggers["pinned"] == recorded
    # Timing differs, what the clients did does not: nearly every trigger is met again.
    assert triggers["share_fired_again"] >= 0.8, triggers
    assert "replay: reproduced" in out and "fired again" in out
    # The replay ran its scripts to their end, with the original's clients.
    run = json.loads((replay / "run.json").read_text())
    assert (
        run["end_reason"] == "scripts_done"
        and run["seed"] == json.loads((original / "run.json").read_text())["seed"]
    )
    scenario = Path(doc["scenario_file"]).read_text()
    assert "[[load.clients]]" in scenario and "at = [\n    { client = " in scenario


def test_what_cannot_be_replayed_is_refused_before_anything_starts(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    refused = lab("replay", str(empty), "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "not a run folder (no run.json)" in refused.stderr
    # A run whose scenario file is gone: a replay needs its tokens, which run.json leaves out.
    run = tmp_path / "run"
    (run / "clients").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r", "scenario_file": str(tmp_path / "gone.toml")}))
    refused = lab("replay", str(run), "--out", str(tmp_path / "out"))
    assert refused.returncode == 3 and "the scenario file it was made from is gone" in refused.stderr
    shutil.copy(ROOT / "scenarios" / "smoke.toml", tmp_path / "gone.toml")
    refused = lab("replay", str(run), "--out", str(tmp_path / "out"), "--clients", "w0-u1")
    assert refused.returncode == 3 and "no client ledger" in refused.stderr
    assert not (tmp_path / "out").exists()  # nothing was started, nothing written
