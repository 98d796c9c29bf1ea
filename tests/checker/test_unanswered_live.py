"""`lab run` with every part real (Locust workers, the nemesis, mitmdump with the addon, the
reference server), no faults: every request the clients send is answered, so the report's
"Unanswered requests by hop" counts 0 of them at every hop, in every bin, and the verdict
notes nothing about the lab; the process monitor recorded each process's fd limit.
(The bad case — requests lost at each hop, a saturated lab part named — is built by hand
in test_unanswered.py: this box cannot be made to collapse on cue within a test's time.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live
SCENARIO = Path(__file__).resolve().parent / "pristine.toml"


def test_a_pristine_run_leaves_no_request_unanswered(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [LAB, "run", str(SCENARIO), "--out", str(out), "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert (run_dir / "report.json").exists(), proc.stderr[-2000:]
    doc = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    un = doc["unanswered"]
    assert un["status"] == "ok" and un["sources"] == ["client", "tap", "server"], un
    assert un["sent"] > 20 and un["sent"] == un["reached_proxy"] == un["answered_at_client"], un
    assert un["unanswered"] == 0 and un["closed_early"] == 0 and un["open_at_proxy_stop"] == 0, un
    assert set(un["by_hop"].values()) == {0} and un["witnesses"] == []
    assert un["bins"] and all(b["unanswered"] == 0 for b in un["bins"])
    assert un["many"] is False and un["lab_limit"] is None and un["lab_saturated"] is None
    assert not any("unanswered" in n for n in doc["liveness"]["notes"])
    assert not any("went unanswered" in n for g in doc["gates"] for n in g["notes"])
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## Unanswered requests by hop" in md and f"0 of {un['sent']:,} requests went unanswered." in md
    # Every sampled lab process has its soft fd limit recorded.
    samples = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]
    limits = {s["part"]: s["fd_limit"] for s in samples if s["type"] == "sample"}
    for part in ("nemesis", "mitmproxy", "worker-0", "server"):
        assert isinstance(limits.get(part), int) and limits[part] > 0, limits
