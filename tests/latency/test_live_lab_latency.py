"""`lab run` with every part real: a Locust worker that blocks its gevent loop (the
test-only hook `LAB_TEST_LOOP_STALL_MS`, lab/load/locustfile.py) makes the report warn
that the lab's own delivery latency distorts gate 5, naming that worker; the same
scenario without the hook does not warn."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lab.checker.health.lab_latency import NOTE_PREFIX
from lab.report.document import rules_of
from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live
SCENARIO = Path(__file__).resolve().parent / "tiny.toml"
TEST_LOOP_STALL = "LAB_TEST_LOOP_STALL_MS"
"""lab.load.locustfile.TEST_LOOP_STALL (not imported: importing Locust patches the process)."""


def lab_run(out: Path, stall: str | None) -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if k != TEST_LOOP_STALL}
    if stall is not None:
        env[TEST_LOOP_STALL] = stall
    proc = subprocess.run(
        [LAB, "run", str(SCENARIO), "--out", str(out), "--quiet", "--no-figures"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    folders = [p for p in out.iterdir() if p.is_dir()]
    assert len(folders) == 1, proc.stderr[-2000:]
    report = json.loads((folders[0] / "report.json").read_text(encoding="utf-8"))
    return report, (folders[0] / "report.md").read_text(encoding="utf-8")


def delivery(report: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(h for h in report["lab_latency"]["hops"] if h["hop"] == "delivery")
    return found


def gate5_notes(report: dict[str, Any]) -> list[str]:
    return [n for g in rules_of(report) if g["number"] == 5 for n in g["notes"] if n.startswith(NOTE_PREFIX)]


def test_a_worker_that_blocks_its_loop_is_warned_about(tmp_path: Path) -> None:
    # Worker 0 holds its loop 2 s of every 2.5 s: most of its events wait, up to 2 s (a
    # longer hold would miss Locust's heartbeats, 3 of 1 s each, and lose the worker).
    report, md = lab_run(tmp_path / "results", "2000/2500@0")
    hop = delivery(report)
    assert hop["measured"] and hop["count"] > 100, hop
    by_worker = {w["part"]: w for w in hop["by_worker"]}
    assert by_worker["worker-0"]["p99_s"] > 1.0, by_worker  # the stalled worker's own delay
    warned = {w["hop"]: w for w in report["lab_latency"]["warnings"]}
    assert "delivery" in warned and warned["delivery"]["process"] == "worker-0", warned
    assert any("'delivery'" in n and "worker-0" in n for n in gate5_notes(report)), gate5_notes(report)
    assert "Warning: the lab's own latency on one step of the chain, proxy forwards an event → client" in md
    assert "(hop 'delivery')" in md


@pytest.mark.long
def test_the_same_run_without_the_stall_is_not_warned_about(tmp_path: Path) -> None:
    report, md = lab_run(tmp_path / "results", None)
    hop = delivery(report)
    assert hop["measured"] and hop["count"] > 100, hop
    request = next(h for h in report["lab_latency"]["hops"] if h["hop"] == "request")
    assert request["measured"] and request["count"] > 0, request
    assert report["lab_latency"]["warnings"] == [], report["lab_latency"]["warnings"]
    assert gate5_notes(report) == []
    assert "## Lab latency" in md and "Warning: the lab's own latency" not in md
