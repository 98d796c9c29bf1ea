"""Adapter processes on their own: what they refuse, how they fail, how they end; the host's
choice of adapter; and the example adapter of docs/clients.md, run for real."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.run.options import free_port
from lab.sut.host import (
    AdapterProcess,
    AdapterUnavailable,
    adapter_command,
    read_app_log,
    typescript_script,
)
from lab.sut.protocol import Call, Cancel, Leave, Start
from tests.livesrv import reference_server
from tests.sut.live import KEY, ServerLedger, adapter_or_skip, by_ev, outcomes, wait_for

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ["python-sdk", "typescript-sdk"]


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there


@pytest.mark.parametrize("name", ADAPTERS)
def test_an_adapter_without_the_run_key_cannot_run(name: str) -> None:
    adapter_or_skip(name)
    env = {k: v for k, v in os.environ.items() if k != "LAB_LEDGER_KEY"}
    out = subprocess.run(
        adapter_command(name).argv, env=env, input=b"", capture_output=True, timeout=30, cwd=ROOT
    )
    assert out.returncode == 3
    assert b"LAB_LEDGER_KEY" in out.stderr
    assert out.stdout == b""


@pytest.mark.parametrize("name", ADAPTERS)
def test_bad_commands_are_refused_and_failed_clients_say_why(tmp_path: Path, name: str) -> None:
    adapter_or_skip(name)
    log = tmp_path / "app.jsonl"
    with AdapterProcess(adapter_command(name), log, key=KEY, cwd=ROOT) as adapter:
        adapter.wait_ready()
        adapter.send_raw("{this is not json")
        adapter.send_raw(
            '{"cmd": "call", "client": "nobody", "call": "x", "tool": "echo", "idempotencyKey": "k"}'
        )
        adapter.send(Start("far", closed_port_url(), None))
        adapter.send(Call("far", "far:1", "echo", {}, "k-far-1"))  # waits for a start that fails
        adapter.send(Start("far", closed_port_url(), None))  # the same ID twice
        adapter.send(Cancel("no-such-call"))
        adapter.send(Start("future", closed_port_url(), "2099-01-01"))  # a revision no SDK speaks
        records = wait_for(log, lambda r: len(by_ev(r, "start_failed")) == 2 and "far:1" in outcomes(r))
        adapter.send(Call("far", "far:2", "echo", {}, "k-far-2"))  # on a client that is gone
        wait_for(log, lambda r: "far:2" in outcomes(r))
        assert adapter.stop() == 0
    records = read_app_log(log)  # every line is a valid mcpLabAppLog.v1 record
    assert records[0]["ev"] == "ready" and records[-1]["ev"] == "stopped"
    rejected = {r["line"]: r["error"] for r in by_ev(records, "rejected")}
    assert "not a JSON line" in rejected[1]
    assert "unknown client" in rejected[2]
    assert "exists" in rejected[5]
    assert "no running call" in rejected[6]
    failed = {r["client"]: r["error"] for r in by_ev(records, "start_failed")}
    assert "2099-01-01" in failed["future"]
    assert failed["far"]  # the implementation's own words for a refused connection
    for call in ("far:1", "far:2"):
        assert outcomes(records)[call]["status"] == "exception"
        assert outcomes(records)[call]["error"] == f"client ended: {failed['far']}"


def test_the_host_names_what_is_missing_for_each_adapter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert adapter_command("python-sdk").argv[1:] == ("-m", "lab.sut.python_sdk")
    assert adapter_command("cmd:python3 'my adapter.py' --fast").argv == (
        "python3",
        "my adapter.py",
        "--fast",
    )
    with pytest.raises(ValueError, match="cmd:<command> needs a command"):
        adapter_command("cmd:")
    with pytest.raises(ValueError, match="one of lab, python-sdk, typescript-sdk or cmd:<command>"):
        adapter_command("java-sdk")
    assert typescript_script().is_file()

    monkeypatch.setenv("PATH", str(tmp_path))  # no node here
    with pytest.raises(AdapterUnavailable, match=r"needs Node\.js: no `node` on PATH"):
        adapter_command("typescript-sdk")
    fake_node = tmp_path / "node"
    fake_node.write_text("#!/bin/sh\nexit 0\n")
    fake_node.chmod(0o755)
    monkeypatch.setenv("LAB_NODE_DIR", str(tmp_path / "empty"))
    with pytest.raises(AdapterUnavailable, match="run `make node-adapter`"):
        adapter_command("typescript-sdk")


def test_a_command_that_cannot_be_started_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(AdapterUnavailable, match="cannot start adapter"):
        AdapterProcess(adapter_command(f"cmd:{tmp_path}/no-such-adapter"), tmp_path / "app.jsonl", key=KEY)


def docs_example() -> str:
    text = (ROOT / "docs" / "clients.md").read_text(encoding="utf-8")
    section = text.split("## Writing an adapter", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/clients.md lost its example adapter"
    return match.group(1)


@pytest.mark.live
def test_the_example_adapter_of_the_docs_works_against_the_reference_server(tmp_path: Path) -> None:
    script = tmp_path / "adapter.py"
    script.write_text(docs_example())
    assert len(docs_example().splitlines()) <= 85, "the example should stay an afternoon's work"
    log = tmp_path / "app.jsonl"
    command = adapter_command(f"cmd:{sys.executable} {script}")
    with reference_server(tmp_path) as srv, AdapterProcess(command, log, key=KEY) as adapter:
        ready = adapter.wait_ready()
        adapter.send(Start("t1", srv.url, None))
        adapter.send(Call("t1", "t1:echo", "echo", {"text": "from the docs"}, "k-docs-echo"))
        adapter.send(Call("t1", "t1:write", "ledger.append", {"entry": "docs"}, "k-docs-write"))
        adapter.send(Call("t1", "t1:bad", "ticker", {"count": -1}, "k-docs-bad"))
        adapter.send(Leave("t1"))
        wait_for(log, lambda r: bool(by_ev(r, "left")))
        assert adapter.stop() == 0
    records = read_app_log(log)
    ledger = ServerLedger(tmp_path / "ledger.sqlite")
    assert ready["implementation"] == {"name": "tinyclient", "version": "0.1"}
    assert by_ev(records, "started")[0]["session"] in ledger.sessions()
    results = outcomes(records)
    assert results["t1:echo"]["status"] == "ok" and results["t1:write"]["status"] == "ok"
    assert results["t1:bad"]["status"] == "error" and results["t1:bad"]["code"] == -32602
    answers = [r for r in by_ev(records, "deliver") if r["call"] is not None]
    assert {r["call"] for r in answers} == set(results)
    assert all(r["digest"] in ledger.event_digests() for r in answers)
    assert ledger.dispatches() == [("k-docs-write", "performed")]


def test_the_host_loads_no_event_loop_and_no_sdk() -> None:
    # Locust's gevent-patched processes import the host; an event-loop library or an SDK
    # imported there would run under gevent's patches (and cost every worker its memory).
    code = (
        "import sys, lab.sut.host, lab.sut.protocol\n"
        "print(','.join(m for m in ('anyio', 'asyncio', 'trio', 'mcp', 'httpx2', 'locust') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, lab.sut.runtime; print('anyio' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "True"  # the probe sees an import where there is one
