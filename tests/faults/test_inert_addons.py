"""The lab's proxy drops mitmdump's inert default addons, and only when nothing else was asked of it.

mitmproxy dispatches every flow event to every addon of its chain; the 28 default addons
the lab never uses were most of the proxy's CPU per request (docs/faults.md). Real
mitmdump processes: one with the lab's own options, one given an option of another addon.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.faults.live import McpClient, fault_proxy, reference_server


def _dropped_line(log: Path) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if "inert mitmproxy addons dropped" in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no 'inert mitmproxy addons dropped' line in {log}")


def _plan(tmp: Path) -> Path:
    plan = tmp / "plan.json"
    plan.write_text('{"schema": "mcpLabFaultPlan.v1", "seed": 1, "rules": []}')
    return plan


def test_the_lab_proxy_drops_the_inert_addons_and_still_forwards(tmp_path: Path) -> None:
    with (
        reference_server(tmp_path) as srv,
        fault_proxy(tmp_path, srv.url.rsplit("/", 1)[0], _plan(tmp_path), tmp_path / "tap.jsonl") as px,
    ):
        line = _dropped_line(px.log)
        m = re.search(r"(\d+) inert mitmproxy addons dropped$", line)
        assert m is not None and int(m.group(1)) >= 20, line
        # What the lab needs of the proxy still works: a handshake is forwarded and answered
        # (initialize 200 with a session, notifications/initialized 202).
        with McpClient(px.url + "/mcp", "inert", token=None) as client:
            client.initialize()
        assert client.session_id


def test_a_proxy_given_another_addons_option_keeps_every_addon(tmp_path: Path) -> None:
    with fault_proxy(
        tmp_path, "http://127.0.0.1:9", _plan(tmp_path), tmp_path / "tap.jsonl", "--set", "anticache=true"
    ) as px:
        line = _dropped_line(px.log)
        assert "0 inert mitmproxy addons dropped (an option the lab does not set was given" in line, line
