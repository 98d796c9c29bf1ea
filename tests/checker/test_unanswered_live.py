"""`lab run` with every part real (Locust workers, the nemesis, mitmdump with the addon, the
reference server), no faults: every request the clients send is answered, so the report's
"Unanswered requests by hop" counts 0 of them at every hop, in every bin, and the verdict
notes nothing about the lab; the process monitor recorded each process's fd limit. And
the collapse on cue: every process of a run started under an open-files limit of 600
(RLIMIT_NOFILE, which any process may lower for its children) with 380 clients, so the
proxies run out of descriptors; the report puts the unanswered requests on the lab, naming
the proxies, and fails no gate. (Each hop's losses one by one are built by hand in
test_unanswered.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lab.report.document import rules_of
from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live
SCENARIO = Path(__file__).resolve().parent / "pristine.toml"
STARVED = Path(__file__).resolve().parent / "fd-starved.toml"
STARVED_FDS = 600


def lab_run(
    scenario: Path, out: Path, *, timeout: float, open_files: int | None = None
) -> tuple[int, Path, dict[str, Any]]:
    """`lab run` on `scenario`: (exit code, run folder, report.json). With `open_files`, a
    shell lowers the soft and hard limit and execs `lab run`, whose parts inherit it (lab
    run raises the soft limit only up to the hard one; no preexec_fn: this process has
    threads)."""
    argv = [LAB, "run", str(scenario), "--out", str(out), "--quiet", "--no-figures"]
    if open_files is not None:
        argv = ["sh", "-c", f'ulimit -n {open_files} && exec "$0" "$@"', *argv]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    assert (run_dir / "report.json").exists(), proc.stderr[-2000:]
    return proc.returncode, run_dir, json.loads((run_dir / "report.json").read_text(encoding="utf-8"))


def test_a_pristine_run_leaves_no_request_unanswered(tmp_path: Path) -> None:
    _, run_dir, doc = lab_run(SCENARIO, tmp_path / "results", timeout=120)
    assert not list(run_dir.glob("*.png")) and (run_dir / "report.html").is_file()  # --no-figures
    un = doc["unanswered"]
    assert un["status"] == "ok" and un["sources"] == ["client", "tap", "server"], un
    assert un["sent"] > 20 and un["sent"] == un["reached_proxy"] == un["answered_at_client"], un
    assert un["unanswered"] == 0 and un["closed_early"] == 0 and un["open_at_proxy_stop"] == 0, un
    assert set(un["by_hop"].values()) == {0} and un["witnesses"] == []
    assert un["bins"] and all(b["unanswered"] == 0 for b in un["bins"])
    assert un["many"] is False and un["lab_limit"] is None and un["lab_saturated"] is None
    assert not any("unanswered" in n for n in doc["liveness"]["notes"])
    assert not any("went unanswered" in n for g in rules_of(doc) for n in g["notes"])
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## Unanswered requests by hop" in md and f"0 of {un['sent']:,} requests went unanswered." in md
    # Every sampled lab process has its soft fd limit recorded.
    samples = [json.loads(line) for line in (run_dir / "processes.jsonl").read_text().splitlines()]
    limits = {s["part"]: s["fd_limit"] for s in samples if s["type"] == "sample"}
    for part in ("nemesis", "mitmproxy", "worker-0", "server"):
        assert isinstance(limits.get(part), int) and limits[part] > 0, limits


@pytest.mark.long
def test_proxies_out_of_descriptors_are_named_and_the_target_is_not_blamed(tmp_path: Path) -> None:
    code, run_dir, doc = lab_run(STARVED, tmp_path / "results", timeout=150, open_files=STARVED_FDS)
    assert code == 2 and doc["verdict"] in ("inconclusive", "incomplete"), doc["verdict"]
    assert "fail" not in {g["verdict"] for g in rules_of(doc)}, [
        (g["number"], g["verdict"]) for g in rules_of(doc)
    ]
    un = doc["unanswered"]
    assert un["unanswered"] > 0 and un["lab_limit"] is not None, un
    starved = [r for r in un["lab_limit"]["reasons"] if r.endswith(f"of {STARVED_FDS} file descriptors")]
    assert {r.split(":")[0] for r in starved} & {"nemesis", "mitmproxy"}, un["lab_limit"]["reasons"]
    assert "server" not in un["lab_limit"]["parts"], un["lab_limit"]  # the target is never the lab
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "Verdict note: limited by the lab (" in md and "Out of file descriptors: " in md
