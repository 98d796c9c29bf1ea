"""The official Python SDK's client in the modern era (2026-07-28) as a client under test:
`lab run --client python-sdk --era modern` connects it as `Client(mode="auto")` does
(`server/discover` first), and judges it from the wire and its application log. Two
findings about mcp 2.3 show on the reference server, each with client witnesses:

- gate 1: a response of another request injected into a call's stream (the proxy's
  `inject_foreign`) is handed to the application as the call's answer: the SDK's
  transport overwrites the id of any response on a request's SSE stream with the
  request's own (`_handle_sse_event`, `original_request_id`);
- gate 5: a call whose stream was cut is never re-issued (the SDK resolves it with a
  local error, "SSE stream ended without a response"), where the revision's changelog says
  a client MUST re-issue it under a new request ID.

The SDK's own error for a lost stream is its report of the loss, not a message taken from
another stream: gate 1 does not count it (lab.checker.truth.client_delivery)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.livesrv import run_scenario
from tests.sut.live import adapter_or_skip

pytestmark = pytest.mark.live

SCENARIO = """
description = "the SDK client, modern era"
seed = 28

[target]
kind = "reference"
era = "modern"

[load]
users = 6
spawn_rate = 6
duration = "8s"
hard_timeout = "60s"
wait_min = "100ms"
wait_max = "300ms"

[load.mix]
read = 1
stream = 2

[load.ticker]
count = 10
interval = "20ms"

[[faults]]
kind = "inject_foreign"
rate = 0.1

[[faults]]
kind = "cut_stream"
rate = 0.05
match = { tools = ["ticker"] }
"""


def test_the_python_sdk_client_in_the_modern_era_is_judged_with_its_findings(tmp_path: Path) -> None:
    adapter_or_skip("python-sdk")
    done, run = run_scenario(tmp_path, "sdk-modern", SCENARIO, "--client", "python-sdk", timeout=180)
    report = json.loads((run / "report.json").read_text())
    rules = report["rules"]
    assert done.returncode == 1, done.stderr[-2000:]
    # It spoke the modern era: discovery, no session, every request stamped.
    log = [json.loads(line) for line in (run / "clients" / "app-0.jsonl").read_text().splitlines()]
    started = [r for r in log if r.get("ev") == "started"]
    assert started and {r["protocolVersion"] for r in started} == {"2026-07-28"}
    flows = [json.loads(line) for line in (run / "proxy" / "tap.jsonl").read_text().splitlines()]
    flows = [f for f in flows if f.get("type") == "flow"]
    assert any(f["jsonrpc_method"] == "server/discover" for f in flows)
    assert all(f["protocol_version_in"] == "2026-07-28" and f["session"] is None for f in flows)
    # The rules of sessions and resumption are not applicable; the modern era's judged.
    assert rules["missing_rehandshake"]["verdict"] == "not_applicable"
    assert rules["client_resume_cursor"]["verdict"] == "not_applicable"
    # The two findings, each the client's.
    cross = rules["cross_stream"]
    assert cross["verdict"] == "fail"
    assert {w["check"] for w in cross["witnesses"]} >= {"delivered_altered"}
    assert all(w["attribution"] == "client" for w in cross["witnesses"])
    resume = rules["resume_p99"]
    assert resume["verdict"] == "fail" and resume["measured"]["never_recovered"] >= 1
