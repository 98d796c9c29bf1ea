"""The sync driver where it is used: in a gevent-patched process, against the live server."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.livesrv import ROOT, reference_server

pytestmark = pytest.mark.live


def test_sync_driver_under_gevent(tmp_path: Path) -> None:
    with reference_server(tmp_path) as srv:
        db = tmp_path / "client.sqlite"
        out = subprocess.run(
            [sys.executable, "-m", "tests.helpers.gevent_client", srv.url, str(db)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # idle_sockets: the GET stream only; the handshake's connection was closed after its
    # keep-alive, although the client sent nothing more (httpcore alone would keep it).
    assert summary == {
        "outcomes": ["ok", "ok"],
        "leave": ["deleted"],
        "gevent": True,
        "idle_sockets": 1,
        # A call answered on its SSE stream leaves its connection to the next one (each
        # opened its own when the driver closed a stream as soon as its answer came).
        "calls_leaving_a_kept_connection": 3,
    }
    con = sqlite3.connect(db)
    resumes = con.execute(
        "SELECT COUNT(*) FROM reconnects WHERE kind='resume' AND advised_delay=0.05"
    ).fetchone()[0]
    assert resumes >= 2  # the server closed the ticker's stream every 3 events: resumed by GET
    seqs = [r[0] for r in con.execute("SELECT sequence FROM inbox WHERE stream_key='post:3' ORDER BY rowid")]
    assert seqs == list(range(11))
    exchanges = {r[0] for r in con.execute("SELECT purpose FROM http_exchanges")}
    assert {"initialize", "standalone", "call", "resume", "delete"} <= exchanges
