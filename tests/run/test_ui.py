"""`lab run --ui`: the STOP of Locust's web UI ends the load, and with it the run, within a
few seconds (not at the hard timeout). The test presses STOP the way the page does: a POST
to the UI's /stop."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from lab.run.watch import LoadStopped
from tests.robustness.runs import HERE as ROBUST
from tests.robustness.runs import kill_all, start_run, wait_gone

pytestmark = pytest.mark.live


def test_load_stopped_needs_clients_first_then_silence() -> None:
    d = LoadStopped(after=3.0)
    assert not d.observe(0.0, 0) and not d.observe(10.0, 0)  # not started yet: not stopped
    assert not d.observe(11.0, 4)
    assert not d.observe(12.0, 0) and not d.observe(14.0, 0)
    assert d.observe(15.0, 0)
    assert not d.observe(16.0, 2)  # back: not stopped


def test_the_ui_stop_ends_the_run_within_seconds(tmp_path: Path) -> None:
    run = start_run(tmp_path, ROBUST / "robust.toml", "--ui", "--no-report")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        pids = list(run.pids().values())
        (url,) = re.findall(r"Locust web UI: (http://127\.0\.0\.1:\d+)", run.output())
        httpx.post(f"{url}/stop", timeout=10).raise_for_status()
        pressed = time.monotonic()
        code = run.wait(60)
        ended_in = time.monotonic() - pressed
        assert wait_gone(pids, within=5) == []
    finally:
        kill_all(pids)
    doc = run.run_json()
    assert doc["end_reason"] == "stopped from the Locust UI" and doc["complete"] is False  # stopped early
    assert code == 2
    assert ended_in < 30, f"the run took {ended_in:.0f}s to end after STOP (hard timeout: 90 s)"
