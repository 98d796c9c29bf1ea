"""`lab run --client`: official SDK clients as the load, through the proxy against the
reference server, judged from the wire (every part really started)."""

from __future__ import annotations

import json
import os
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

from lab.report.document import rules_of
from tests.livesrv import LAB, ROOT
from tests.sut.live import adapter_or_skip

pytestmark = pytest.mark.live
HERE = Path(__file__).resolve().parent
IMPLEMENTATION = {"python-sdk": "mcp", "typescript-sdk": "@modelcontextprotocol/sdk"}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.long
@pytest.mark.parametrize("client", ["python-sdk", "typescript-sdk"])
def test_sdk_clients_are_judged_from_the_wire(tmp_path: Path, client: str) -> None:
    adapter_or_skip(client)
    out = tmp_path / "results"
    proc = subprocess.run(
        [
            LAB,
            "run",
            str(HERE / "sdk-mini.toml"),
            "--client",
            client,
            "--out",
            str(out),
            "--quiet",
            "--no-figures",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "LAB_NODE_DIR": str(ROOT / ".node")},
    )
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    record = json.loads((run / "run.json").read_text())
    report = json.loads((run / "report.json").read_text())
    assert record["complete"] is True, record["end_reason"]

    # The implementation and its version, in run.json and the report.
    impl = record["client"]["implementation"]
    assert record["client"]["kind"] == client and impl["name"] == IMPLEMENTATION[client]
    if client == "python-sdk":
        assert impl["version"] == version("mcp")
    text = f"{impl['name']} {impl['version']}"
    assert report["client"]["implementation"] == text
    assert text in (run / "report.md").read_text()

    # Each worker's adapter wrote its application log into the run folder and is gone.
    adapters = record["client"]["adapters"]
    assert [a["log"] for a in adapters] == ["clients/app-0.jsonl"] and (
        run / "clients" / "app-0.jsonl"
    ).stat().st_size
    assert not alive(adapters[0]["pid"])

    # Gate 3 from the wire: both SDKs keep the dead session ID after a 404 (docs/clients.md).
    gates = {g["gate"]: g for g in rules_of(report)}
    assert len(gates) == 11 and all(g["truth_from"] for n, g in gates.items() if n != "illegal_origin")
    assert gates["declared_capabilities"]["verdict"] == "pass"  # the reference server declares what it sends
    g3 = gates["missing_rehandshake"]
    assert g3["verdict"] == "fail", g3["summary"]
    assert g3["measured"]["session_404s"] >= 1
    for w in g3["witnesses"]:
        assert w["attribution"] == "client" and w["check"] == "no_rehandshake"
        assert len(w["refs"]) == 2 and all(r.startswith("proxy/tap.jsonl:") for r in w["refs"])
    # ... and every violation of every gate has a witness that points at the wire or the app log.
    for g in rules_of(report):
        for w in g["witnesses"]:
            assert any(r.startswith(("proxy/tap.jsonl:", "clients/app-0.jsonl:")) for r in w["refs"]), w
    assert gates["client_resume_cursor"]["measured"]["resumptions"] >= 1
    # What the implementation was told of the tools, for the retry rule (client_resend).
    if client == "python-sdk":  # (it lists the tools after a tool's first call)
        tap = [json.loads(line) for line in (run / "proxy" / "tap.jsonl").read_text().splitlines()]
        listed = [r["tools"] for r in tap if r.get("type") == "tools"]
        assert listed and listed[0]["echo"] == {"readOnlyHint": True}, listed[:1]
    assert "resent_allowed" in gates["client_resend"]["measured"]
    assert proc.returncode == 1  # a gate failed
