"""Real processes for the client-under-test tests: the reference server, a wire spy
(mitmdump with tests/sut/spy_addon.py) in front of it, and an adapter process."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab.sut.host import AdapterUnavailable, adapter_command, read_app_log
from tests.livesrv import LEDGER_KEY, stop, wait_for_line

ADMIN = "admin-token-for-tests"
KEY = bytes.fromhex(LEDGER_KEY)
SPY = Path(__file__).with_name("spy_addon.py")


def adapter_or_skip(name: str) -> None:
    """Skip (with the reason) when this adapter cannot run on this machine."""
    try:
        adapter_command(name)
    except AdapterUnavailable as e:
        pytest.skip(str(e))


@dataclass
class Spy:
    url: str
    path: Path

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def raw_session_ids(self) -> set[str]:
        return {s for r in self.records() for s in (r["sent"], r["given"]) if s}


@contextmanager
def wire_spy(tmp: Path, upstream_url: str) -> Iterator[Spy]:
    """mitmdump in reverse mode in front of `upstream_url` (http://127.0.0.1:PORT/mcp)."""
    base = upstream_url.rsplit("/", 1)[0]
    log, path = tmp / f"spy-{time.monotonic_ns()}.log", tmp / "spy.jsonl"
    argv = [
        str(Path(sys.executable).with_name("mitmdump")),
        "-q",
        "--mode",
        f"reverse:{base}",
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        "0",
        "--set",
        "connection_strategy=lazy",
        "-s",
        str(SPY),
    ]
    env = {**os.environ, "LAB_SUT_SPY_FILE": str(path)}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        yield Spy(wait_for_line(proc, log, "spy listening on "), path)
    finally:
        stop(proc)


def expire(server_url: str, raw_session_id: str) -> None:
    """The reference server's admin control: end that session now (later requests: 404)."""
    r = httpx.post(
        server_url.replace("/mcp", "/lab-admin/expire"),
        headers={"x-lab-admin-token": ADMIN, "mcp-session-id": raw_session_id},
    )
    assert r.status_code == 200, r.text


def wait_for(
    log: Path, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        records = read_app_log(log) if log.exists() else []
        if done(records):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError("the application log never got there:\n" + "\n".join(map(str, records[-30:])))
        time.sleep(0.05)


def outcomes(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["call"]: r for r in records if r["ev"] == "outcome"}


def by_ev(records: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if r["ev"] == ev and all(r.get(k) == v for k, v in match.items())]


class ServerLedger:
    """The reference server's SQLite ledger (mcpServerLedger.v1), read after the server stopped."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path)

    def sessions(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT session FROM sessions")}

    def event_digests(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT digest FROM events_sent")}

    def dispatches(self) -> list[tuple[str, str]]:
        return list(self.db.execute("SELECT idempotency_key, effect FROM dispatches"))


def has_node_sdk() -> bool:
    return shutil.which("node") is not None
