"""Traffic that stops is noticed: when the target or the nemesis stops answering (SIGSTOP:
alive, silent), the run ends as incomplete, "traffic stalled", within the scenario's
stall bound (4 s here) plus the one-second watch, and names what was in place."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.robustness.runs import HERE, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live


@pytest.mark.parametrize("part", ["server", "nemesis"])
def test_a_part_that_stops_answering_ends_the_run_as_stalled(tmp_path: Path, part: str) -> None:
    run = start_run(tmp_path, HERE / "stall.toml", "--no-report")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        named = run.pids()
        pids = list(named.values())
        os.kill(named[part], signal.SIGSTOP)
        stopped = time.time()
        code = run.wait(120)
        assert wait_gone(pids, within=5) == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        kill_all(pids)
    assert code == 2, run.output()
    doc = json.loads((run.folder() / "run.json").read_text())  # type: ignore[operator]
    assert doc["complete"] is False and doc["end_reason"].startswith(
        "traffic stalled: no event sent and no call"
    )
    assert "in place then: no toxic, no fault window" in doc["end_reason"]
    assert doc["stopped_at"] is not None
    # Noticed within the bound: the first silent second, 4 s without progress, the next look.
    log = run.output()
    assert "traffic stalled" in log
    lines = [line for line in log.splitlines() if line.startswith("[")]
    assert lines, log
    noticed_after = float(lines[-1].split("s/")[0].strip("[ ")) - (stopped - doc["started_at"])
    assert noticed_after <= 4 + 3, f"noticed {noticed_after:.1f}s after the part stopped"
