"""No raw secret anywhere in a run folder: every file of it (run.json, logs/, ledgers,
the tap, the report) is searched, as bytes, for the bearer token, the per-run admin
token and ledger key, and the raw session IDs of sessions opened through the run's own
chain while it ran (the test opens them as one more client, so it knows them)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import pytest

from lab.wire.revisions import LAST_EVENT_ID_HEADER, PROTOCOL_VERSION_HEADER, SESSION_HEADER
from tests.robustness.runs import HERE, kill_all, start_run, wait_gone

pytestmark = pytest.mark.live
TOKEN = "tok-sekrit-7f3a9c51"
HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "authorization": f"Bearer {TOKEN}",
}


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def open_sessions(url: str, n: int) -> list[str]:
    """Sessions through the run's chain, each with a streaming call, a resumption and a
    DELETE; their raw IDs."""
    ids = []
    with httpx.Client(timeout=10, headers=HEADERS) as http:
        for i in range(n):
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            }
            r = http.post(url, json=init)
            sid = r.headers.get(SESSION_HEADER)
            if r.status_code != 200 or not sid:
                continue
            ids.append(sid)
            h = {SESSION_HEADER: sid, PROTOCOL_VERSION_HEADER: "2025-11-25"}
            http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "ticker", "arguments": {"count": 3, "interval_ms": 10}},
            }
            last = ""
            try:
                with http.stream("POST", url, json=call, headers=h) as s:
                    for line in s.iter_lines():
                        if line.startswith("id:"):
                            last = line[3:].strip()
            except httpx.HTTPError:
                pass  # a cut stream: the resumption below uses the last ID seen
            if last:
                with contextlib.suppress(httpx.HTTPError):
                    http.get(
                        url,
                        headers={**h, LAST_EVENT_ID_HEADER: last, "accept": "text/event-stream"},
                        timeout=2,
                    )
            echo = {
                "jsonrpc": "2.0",
                "id": 3,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": f"x{i}"}},
            }
            http.post(url, json=echo, headers=h)
            if i % 2:
                http.delete(url, headers=h)
    return ids


def found_in(folder: Path, secrets: dict[str, str]) -> list[str]:
    """Which secret is in which file of `folder` (every file, read as bytes)."""
    return [
        f"{name} in {path.relative_to(folder)}"
        for path in sorted(p for p in folder.rglob("*") if p.is_file())
        for name, value in secrets.items()
        if value.encode() in path.read_bytes()
    ]


@pytest.mark.long
def test_no_secret_and_no_raw_session_id_anywhere_in_the_run_folder(tmp_path: Path) -> None:
    run = start_run(tmp_path, HERE / "secret.toml")
    pids: list[int] = []
    try:
        run.wait_for_traffic(accepted=5)
        named = run.pids()
        pids = list(named.values())
        env = environ(named["mitmproxy"])  # the fault layer gets both by environment, not argv
        admin, key = env["LAB_ADMIN_TOKEN"], env["LAB_LEDGER_KEY"]
        sessions = open_sessions(run.run_json()["client_url"], 8)
        code = run.wait(120)
        assert wait_gone(pids, within=5) == []
    finally:
        kill_all(pids)
    assert code in (0, 1, 2), run.output()
    assert len(sessions) >= 4 and all(len(s) >= 32 for s in sessions)
    assert len(admin) >= 16 and len(key) == 64
    folder = run.folder()
    assert folder is not None and (folder / "report.json").exists() and (folder / "logs").is_dir()
    assert not (folder / ".secrets").exists()
    secrets = {"bearer token": TOKEN, "admin token": admin, "ledger key": key}
    secrets |= {f"session {i}": s for i, s in enumerate(sessions)}
    assert len([p for p in folder.rglob("*") if p.is_file()]) > 10
    assert found_in(folder, secrets) == []
    # The search sees a secret where one is: plant one in a log, as a careless part would.
    (folder / "logs" / "server.log").open("a").write(f"session {sessions[0]} opened\n")
    assert found_in(folder, secrets) == ["session 0 in logs/server.log"]
    doc = json.loads((folder / "run.json").read_text())
    assert "<admin-token>" in json.dumps(doc["processes"]) or "--config" in json.dumps(doc["processes"])
    assert "token-1" in doc["scenario"]["target"]["tokens"]
