"""A part that dies mid-run (kill -9 of each, in turn) ends the run as incomplete, not as
"could not be made": the run stops every other part, run.json names the part and its exit
status, the report is written from the evidence up to the death, and `lab run` exits
with the code `lab report` gives that folder (never 0, never 3).

One run per part, all five side by side in one results root (runs must support that
anyway): the test then takes the time of one run, not five."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB
from tests.robustness.runs import HERE, Background, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live
PARTS = ("server", "mitmproxy", "nemesis", "master", "worker-0")


@pytest.mark.long
def test_kill_9_of_each_part_ends_its_run_incomplete_with_a_report(tmp_path: Path) -> None:
    runs: dict[str, Background] = {}
    pids: list[int] = []
    try:
        for part in PARTS:
            (tmp_path / part).mkdir()
            runs[part] = start_run(tmp_path / part, HERE / "robust.toml", results=tmp_path / "results")
        for part, run in runs.items():
            run.wait_for_traffic(accepted=10, within=120)
            named = run.pids()
            pids += named.values()
            os.kill(named[part], signal.SIGKILL)
        codes = {part: run.wait(150) for part, run in runs.items()}
        assert wait_gone(pids, within=5) == []
    finally:
        kill_all(pids)
        for run in runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
    for part, run in runs.items():
        out = run.output()
        assert codes[part] in (1, 2), (part, out)  # incomplete: never a pass, never "could not be made"
        folder = run.folder()
        assert folder is not None
        doc = json.loads((folder / "run.json").read_text())
        assert doc["status"] == "finished" and doc["complete"] is False, part
        assert doc["part_died"] == part and doc["end_reason"] == f"part died: {part} exited with -9"
        assert f"{part} died" in out or part == "master"
        assert {p["name"]: p["exit_code"] for p in doc["processes"]}[part] == -9
        report = json.loads((folder / "report.json").read_text())
        assert "part died" in json.dumps(report), f"{part}: the report says why the run is incomplete"
    assert len(list((tmp_path / "results").iterdir())) == len(PARTS), "one folder per run"
    folder = runs["server"].folder()
    assert folder is not None
    again = subprocess.run(
        [LAB, "report", str(folder), "-q", "--no-figures"], capture_output=True, timeout=120
    )
    assert again.returncode == codes["server"], "lab run and lab report give one verdict"
