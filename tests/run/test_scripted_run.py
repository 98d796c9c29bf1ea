"""`lab run` of scripted clients (`[[load.clients]]`) with every real part: each client
under its own ID does its ops in order, none before its time, leaves, and the run ends
by itself once both are done, long before its duration."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.livesrv import LAB, ROOT

pytestmark = pytest.mark.live

SCENARIO = """
description = "Two scripted clients"
seed = 5

[load]
duration = "60s"      # a bound only: the scripts end the run
hard_timeout = "90s"

[load.ticker]
count = 5
interval = "20ms"

[[load.clients]]
id = "w0-u7"
ops = ["read", "stream"]
at = [0.2, 0.6]

[[load.clients]]
id = "w0-u9"
ops = ["write"]
at = [1.0]
"""
SCRIPTS = {"w0-u7": [("echo", 0.2), ("ticker", 0.6)], "w0-u9": [("ledger.append", 1.0)]}


def test_a_scripted_run_plays_each_script_and_ends_when_they_are_done(tmp_path: Path) -> None:
    path = tmp_path / "scripted.toml"
    path.write_text(SCENARIO)
    out = tmp_path / "results"
    began = time.monotonic()
    proc = subprocess.run(
        [LAB, "run", str(path), "--out", str(out), "--no-report"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.monotonic() - began
    (folder,) = sorted(p for p in out.iterdir() if p.is_dir())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((folder / "run.json").read_text())
    assert run["end_reason"] == "scripts_done" and run["complete"] is True
    assert run["stopped_at"] - run["started_at"] < 30, "the load ran on after the scripts were done"
    assert took < 60

    start = json.loads((folder / "load-started.json").read_text())["at"]
    assert start == run["started_at"]
    with contextlib.closing(sqlite3.connect(folder / "clients" / "worker-0.sqlite")) as db:
        ops = db.execute(
            "SELECT client_id, tool, started_at, outcome FROM operations ORDER BY started_at"
        ).fetchall()
        deletes = db.execute(
            "SELECT client_id, status FROM http_exchanges WHERE method = 'DELETE' ORDER BY client_id"
        ).fetchall()
        clients = {c for (c,) in db.execute("SELECT DISTINCT client_id FROM http_exchanges")}
    played = {c: [(tool, t - start) for c2, tool, t, _ in ops if c2 == c] for c in SCRIPTS}
    for client, script in SCRIPTS.items():
        assert [tool for tool, _ in played[client]] == [tool for tool, _ in script], played
        for (tool, began_at), (_, at) in zip(played[client], script, strict=True):
            assert began_at >= at, (
                f"{client}'s {tool} started {began_at:.3f} s into the load, before its {at} s"
            )
    assert {c for c, *_ in ops} == clients == set(SCRIPTS)  # the scripts' IDs, verbatim, and no other
    assert all(outcome == "ok" for *_, outcome in ops), ops
    assert deletes == [("w0-u7", 200), ("w0-u9", 200)], "each client leaves (DELETE), once"
    progress = json.loads((folder / "progress.json").read_text())
    assert (progress["scripted"], progress["scripted_started"], progress["scripted_done"]) == (2, 2, 2)
