"""A target that sends garbage (tests/helpers/garbage_target.py: event IDs that are not
UTF-8 nor ASCII, a NUL in an ID, invalid bytes in a message and in a header, every call's
stream cut before its response) never crashes the lab's client and never puts a secret
in the run folder: every request is sent or recorded as lost with a cause in the lab's
words, and the resumptions with those IDs go out (a Last-Event-ID that is not ASCII, in
UTF-8 as a browser sends it; httpx raised UnicodeEncodeError on it, gevent's hub then
printed the request with its bearer token and session ID into the worker's log)."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.livesrv import ROOT
from tests.robustness.runs import HERE, start_run
from tests.robustness.test_secrets import found_in

pytestmark = pytest.mark.live
TOKEN = "tok-garbage-5d1e0b27"


@contextlib.contextmanager
def garbage_target() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.garbage_target"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("garbage target listening on "), line
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.kill()
        proc.wait(10)


def test_a_garbage_target_crashes_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    with garbage_target() as url:
        run = start_run(tmp_path, HERE / "garbage.toml", "--target", url)
        code = run.wait(150)
    folder = run.folder()
    assert folder is not None, run.output()
    # The target is judged (fail or inconclusive); the lab did not fail (4) nor refuse (3).
    assert code in (1, 2), run.output()
    logs = {p.name: p.read_text(errors="replace") for p in (folder / "logs").iterdir()}
    for name, text in logs.items():
        assert "UnicodeEncodeError" not in text and "Traceback" not in text, (name, text[-3000:])
    exchanges: list[tuple[str, int | None, str]] = []
    for path in (folder / "clients").glob("*.sqlite"):
        with contextlib.closing(sqlite3.connect(path)) as db:
            exchanges += db.execute("SELECT purpose, status, error FROM http_exchanges").fetchall()
    # The calls' streams were cut, and each resumption with a non-ASCII ID went out and
    # was answered.
    assert ("resume", 200, "") in exchanges, sorted(set(exchanges))
    assert all(status is not None or error for _, status, error in exchanges), exchanges
    # No raw token or session ID anywhere (the target's session IDs all start so).
    secrets = {"bearer token": TOKEN, "raw session ID": "sess-RAW-"}
    assert found_in(folder, secrets) == []
