"""Lose nothing at exit: users killed mid-construction, then quit; every record is in the file.

Real Locust (gevent) in its own process, against the live reference server: importing
Locust patches the process, so never in the pytest process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lab.load.settings import LoadSettings
from lab.wire.client_ledger import RECORD_TYPES
from tests.livesrv import LEDGER_KEY, ROOT, reference_server

pytestmark = pytest.mark.live


def test_users_killed_while_being_built_lose_no_ledger_row(tmp_path: Path) -> None:
    with reference_server(tmp_path) as srv:
        settings = LoadSettings(
            url=srv.url, run_dir=str(tmp_path / "run"), wait_min=0.01, wait_max=0.05, seed=3
        )
        path = tmp_path / "locust-settings.json"
        path.write_text(settings.to_json(), encoding="utf-8")
        env = {
            **os.environ,
            "LAB_LOCUST_SETTINGS": str(path),
            "LAB_LEDGER_KEY": LEDGER_KEY,
            "LAB_WORKER_INDEX": "0",
        }
        out = subprocess.run(
            [sys.executable, "-m", "tests.helpers.locust_exit", "200"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "AttributeError" not in out.stderr, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["closed"]
    assert summary["begun"] > summary["built"] > 0, "the quit must land while a client is being built"
    handed: dict[str, int] = summary["handed"]
    assert handed.get("http_exchanges", 0) > 0 and handed.get("operations", 0) > 0
    db = sqlite3.connect(summary["db"])
    in_file = {t.table: db.execute(f"SELECT COUNT(*) FROM {t.table}").fetchone()[0] for t in RECORD_TYPES}
    assert in_file == {t.table: handed.get(t.table, 0) for t in RECORD_TYPES}
    accepted = db.execute("SELECT COUNT(*) FROM inbox WHERE kind != 'priming'").fetchone()[0]
    assert accepted == summary["commits"]
    # The last batch is the clients' own end: every operation still running got its outcome.
    stopped = db.execute(
        "SELECT COUNT(*) FROM http_exchanges WHERE error IN ('client_stopped', 'left')"
    ).fetchone()
    assert stopped[0] > 0
