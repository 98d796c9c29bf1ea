"""Two `lab run` started at the same moment in one results root each own a folder and
both work: each gets events, each ends complete, neither writes into the other's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.robustness.runs import SCENARIOS, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live


def test_two_runs_at_once_work_side_by_side(tmp_path: Path) -> None:
    results = tmp_path / "results"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    runs = [start_run(tmp_path / n, SCENARIOS / "url.toml", "--no-report", results=results) for n in "ab"]
    codes = [r.wait(150) for r in runs]
    folders = sorted(p for p in results.iterdir() if p.is_dir())
    assert len(folders) == 2, [f.name for f in folders]
    pids = []
    for folder in folders:
        doc = json.loads((folder / "run.json").read_text())
        pids += [p["pid"] for p in doc["processes"]]
        assert doc["complete"] is True and doc["end_reason"] == "duration", doc["end_reason"]
        assert doc["run_id"] == folder.name
        tap = [json.loads(line) for line in (folder / "proxy" / "tap.jsonl").read_text().splitlines()]
        sent = sum(rec["type"] == "sent" for rec in tap)
        assert sent > 20, f"{folder.name}: {sent} events"
        for line in (folder / "budget_split.jsonl").read_text().splitlines():
            assert json.loads(line)["workers"] <= 1, "a master saw the other run's worker"
    assert codes == [0, 0], [r.output() for r in runs]
    left = wait_gone(pids, within=3)
    kill_all(left)
    assert left == []
