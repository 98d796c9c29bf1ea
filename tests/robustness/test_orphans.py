"""No orphans: after `kill -9` of `lab run` no child outlives it by more than a few seconds,
and the next `lab run` marks the folder abandoned; SIGHUP stops a run like SIGTERM; a
second SIGINT forces a fast stop."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.livesrv import LAB
from tests.robustness.runs import HERE, SCENARIOS, kill_all, start_run, survivors, wait_gone

pytestmark = pytest.mark.live
ROBUST = HERE / "robust.toml"


def test_kill_9_of_lab_run_leaves_no_child_and_the_folder_is_marked_abandoned(tmp_path: Path) -> None:
    run = start_run(tmp_path, ROBUST, "--no-report")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        named = run.pids()
        pids = list(named.values())
        assert len(pids) >= 5 and survivors(pids) != [], "the parts must be running before the kill"
        run.proc.send_signal(signal.SIGKILL)
        run.wait(10)
        left = wait_gone(pids, within=8)
        assert left == [], f"processes outlived lab run: {left} of {named}"
    finally:
        kill_all(pids)
    folder = run.folder()
    assert folder is not None
    doc = json.loads((folder / "run.json").read_text())
    assert doc["status"] == "running" and not (folder / "run.json.tmp").exists()
    # The next lab run (here one that is refused at once) marks it.
    proc = subprocess.run(
        [LAB, "run", str(SCENARIOS / "mini.toml"), "--workers", "11", "--out", str(run.results)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 3
        and f"marked abandoned (its lab run died without finishing): {folder}" in proc.stderr
    )
    doc = json.loads((folder / "run.json").read_text())
    assert doc["status"] == "abandoned" and doc["complete"] is False
    assert doc["end_reason"].startswith("abandoned: the lab run that owned this folder")
    assert not (folder / ".secrets").exists()


def test_sighup_stops_the_run_like_sigterm_and_keeps_its_evidence(tmp_path: Path) -> None:
    sig = signal.SIGHUP  # a closed terminal (SIGTERM and SIGINT: tests/run/test_lab_run.py)
    run = start_run(tmp_path, ROBUST, "--no-report")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        pids = list(run.pids().values())
        run.proc.send_signal(sig)
        code = run.wait(90)
        assert code == 2, run.output()
        assert wait_gone(pids, within=5) == []
    finally:
        kill_all(pids)
    doc = run.run_json()
    assert doc["status"] == "finished" and doc["complete"] is False and doc["end_reason"] == "interrupted"
    assert sig.name in run.output()
    assert all(p["exit_code"] is not None for p in doc["processes"])


def test_a_second_sigint_forces_a_fast_stop(tmp_path: Path) -> None:
    run = start_run(tmp_path, ROBUST, "--no-report")
    pids: list[int] = []
    try:
        run.wait_for_traffic()
        pids = list(run.pids().values())
        run.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # two signals at once would reach Python's handler as one
        run.proc.send_signal(signal.SIGINT)
        code = run.wait(20)  # the graceful stop takes longer: Locust's users leave one by one
        assert code == 2, run.output()
        assert wait_gone(pids, within=3) == []
    finally:
        kill_all(pids)
    assert "again: stopping every part at once" in run.output()
    doc = run.run_json()
    assert doc["complete"] is False and doc["end_reason"] == "interrupted"
