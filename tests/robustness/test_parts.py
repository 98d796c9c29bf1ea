"""A part that dies mid-run (kill -9 of each, in turn) ends the run as incomplete, not as
"could not be made": the run stops every other part, run.json names the part and its exit
status, the report is written from the evidence up to the death, and `lab run` exits
with the code `lab report` gives that folder (never 0, never 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB
from tests.robustness.runs import HERE, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live


@pytest.mark.parametrize("part", ["server", "mitmproxy", "nemesis", "master", "worker-0"])
def test_kill_9_of_a_part_ends_the_run_incomplete_with_a_report(tmp_path: Path, part: str) -> None:
    run = start_run(tmp_path, HERE / "robust.toml")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        named = run.pids()
        pids = list(named.values())
        os.kill(named[part], signal.SIGKILL)
        code = run.wait(150)
        assert wait_gone(pids, within=5) == []
    finally:
        kill_all(pids)
    out = run.output()
    assert code in (1, 2), out  # incomplete: never a pass, never "could not be made"
    folder = run.folder()
    assert folder is not None
    doc = json.loads((folder / "run.json").read_text())
    assert doc["state"] == "finished" and doc["complete"] is False
    assert doc["part_died"] == part and doc["end_reason"] == f"part died: {part} exited with -9"
    assert f"{part} died" in out or part == "master"
    assert {p["name"]: p["exit_code"] for p in doc["processes"]}[part] == -9
    report = json.loads((folder / "report.json").read_text())
    assert "part died" in json.dumps(report), "the report says why the run is incomplete"
    again = subprocess.run(
        [LAB, "report", str(folder), "-q", "--no-figures"], capture_output=True, timeout=120
    )
    assert again.returncode == code, "lab run and lab report give one verdict"
