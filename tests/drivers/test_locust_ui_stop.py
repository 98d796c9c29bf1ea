"""`lab run --ui`: STOP in Locust's web UI ends the load, and the master process with it.

Real Locust (a master with its web UI on 127.0.0.1 and one worker, started as `lab run`
starts them) against the live reference server; STOP is the web UI's own POST /stop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from lab.load.settings import LoadSettings
from lab.run.options import free_port
from tests.livesrv import LEDGER_KEY, ROOT, reference_server, stop

pytestmark = pytest.mark.live
LOCUST = str(Path(sys.executable).with_name("locust"))
LOCUSTFILE = str(ROOT / "lab" / "load" / "locustfile.py")


@contextmanager
def started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        yield proc
    finally:
        stop(proc)


def wait_running(web: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            stats = httpx.get(f"{web}/stats/requests", timeout=2).json()
            if stats.get("state") == "running" and stats.get("user_count", 0) >= 2:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("the load did not start")


def test_stop_in_the_web_ui_ends_the_master_within_seconds(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with reference_server(tmp_path) as srv:
        settings = LoadSettings(
            url=srv.url, run_dir=str(run), stages=((120.0, 4, 4.0),), wait_min=0.1, wait_max=0.3, workers=1
        )
        path = tmp_path / "locust-settings.json"
        path.write_text(settings.to_json(), encoding="utf-8")
        env = {**os.environ, "LAB_LOCUST_SETTINGS": str(path), "LAB_LEDGER_KEY": LEDGER_KEY}
        master_port, web_port = free_port(), free_port()
        master_argv = [LOCUST, "-f", LOCUSTFILE, "--master", "--master-bind-host", "127.0.0.1"]
        master_argv += ["--master-bind-port", str(master_port), "--expect-workers", "1"]
        master_argv += ["--expect-workers-max-wait", "30", "--stop-timeout", "5", "--only-summary"]
        master_argv += ["--exit-code-on-error", "0", "--autostart", "--web-host", "127.0.0.1"]
        master_argv += ["--web-port", str(web_port)]
        worker_argv = [LOCUST, "-f", LOCUSTFILE, "--worker", "--master-host", "127.0.0.1"]
        worker_argv += ["--master-port", str(master_port)]
        with (
            started(master_argv, env, tmp_path / "master.log") as master,
            started(worker_argv, {**env, "LAB_WORKER_INDEX": "0"}, tmp_path / "worker.log") as worker,
        ):
            web = f"http://127.0.0.1:{web_port}"
            wait_running(web, time.monotonic() + 40)
            t0 = time.monotonic()
            assert httpx.post(f"{web}/stop", timeout=10).json()["success"]
            for name, proc in (("master", master), ("worker", worker)):
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    raise AssertionError((tmp_path / f"{name}.log").read_text()[-3000:]) from None
                if name == "master":
                    took = time.monotonic() - t0
    log = (tmp_path / "master.log").read_text()
    assert master.returncode == 0, log[-3000:]
    assert took < 10, f"the master took {took:.1f} s to go after STOP"
    ended = json.loads((run / "load-ended.json").read_text())
    assert ended["reason"] == "stopped_in_ui"
    db = sqlite3.connect(run / "clients" / "worker-0.sqlite")
    purposes = dict(db.execute("SELECT purpose, COUNT(*) FROM http_exchanges GROUP BY purpose").fetchall())
    assert purposes.get("initialize", 0) >= 2 and purposes.get("delete", 0) >= 1  # users left the Locust way
