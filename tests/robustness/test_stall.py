"""Traffic that stops is noticed: when the target or the nemesis stops answering (SIGSTOP:
alive, silent), the run ends as incomplete, "traffic stalled", within the scenario's
stall bound (4 s here) plus the one-second watch, and names what was in place. Both runs
go side by side."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.robustness.runs import HERE, Background, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live
PARTS = ("server", "nemesis")


def test_a_part_that_stops_answering_ends_the_run_as_stalled(tmp_path: Path) -> None:
    runs: dict[str, Background] = {}
    pids: list[int] = []
    stopped: dict[str, float] = {}
    try:
        for part in PARTS:
            (tmp_path / part).mkdir()
            runs[part] = start_run(
                tmp_path / part, HERE / "stall.toml", "--no-report", results=tmp_path / part / "r"
            )
        for part, run in runs.items():
            run.wait_for_traffic(accepted=10, within=120)
            named = run.pids()
            pids += named.values()
            os.kill(named[part], signal.SIGSTOP)
            stopped[part] = time.time()
        codes = {part: run.wait(120) for part, run in runs.items()}
        assert wait_gone(pids, within=5) == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        kill_all(pids)
    for part, run in runs.items():
        assert codes[part] == 2, (part, run.output())
        folder = run.folder()
        assert folder is not None
        doc = json.loads((folder / "run.json").read_text())
        assert doc["complete"] is False and doc["end_reason"].startswith(
            "traffic stalled: no event sent and no call"
        )
        assert "in place then: no toxic, no fault window" in doc["end_reason"]
        # Noticed within the bound: the first silent second, 4 s without progress, the next look.
        lines = [line for line in run.output().splitlines() if line.startswith("[")]
        noticed = float(lines[-1].split("s/")[0].strip("[ ")) - (stopped[part] - doc["started_at"])
        assert noticed <= 4 + 3, f"{part}: noticed {noticed:.1f}s after it stopped answering"
