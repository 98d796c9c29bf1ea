"""The lab's own client follows the retry rule (issue: clients re-send a call whose
outcome is unknown only where the server says that is safe), judged as a client under
test would be, from the wire: a run of the lab's clients against the reference server,
whose `ledger.append` answers are lost after the write ran (`executed_then_lost`) on
streams without a cursor to resume from (`drop_priming`), so that its clients re-send
writes. Check 12 (`client_resend`), read on that run's tap,
finds every re-send allowed: the clients were told in `tools/list` (the tap's `tools`
record) that the server honours the write's idempotency key. (The same check catching a
client that re-sends an unannotated tool: tests/sut/test_client_checks.py; the core
refusing to re-send one: tests/client/test_client.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.checker import load_run
from lab.checker.context import Context, parse_budgets
from lab.checker.rules import client_resend
from tests.livesrv import run_scenario

pytestmark = pytest.mark.live

SCENARIO = """
description = "writes whose answers are lost"
seed = 12

[target]
kind = "reference"

[load]
users = 6
spawn_rate = 6
duration = "8s"
hard_timeout = "60s"
wait_min = "100ms"
wait_max = "300ms"

[load.mix]
read = 1
write = 2

[[faults]]
kind = "executed_then_lost"
rate = 0.4
match = { tools = ["ledger.append"] }

# Without its priming event a cut write stream has no cursor to resume from: the client
# must decide whether to send the write again.
[[faults]]
kind = "drop_priming"
rate = 1.0
match = { tools = ["ledger.append"] }
"""


def test_the_lab_client_re_sends_only_what_the_server_said_is_safe(tmp_path: Path) -> None:
    done, run = run_scenario(tmp_path, "lost-writes", SCENARIO, timeout=120)
    tap = [json.loads(line) for line in (run / "proxy" / "tap.jsonl").read_text().splitlines()]
    told = [r["tools"] for r in tap if r["type"] == "tools"]
    assert told, done.stdout[-2000:] + done.stderr[-2000:]  # each client listed the tools
    assert all(
        t["ledger.append"]
        == {"readOnlyHint": False, "idempotentHint": False, "mcp-lab/idempotency-key": True}
        for t in told
    )
    # The check's findings, from the wire (its evidence, disconnects, reads a client under
    # test's application log, which the lab's client does not write).
    data = load_run(run)
    resent = client_resend.findings(Context(data, parse_budgets(data.run), 5))
    assert len(resent) > 0, "no write was re-sent: the run did not exercise the rule"
    assert resent["allowed"].all(), resent[~resent["allowed"]][["client_id", "call", "tool", "annotations"]]
    assert set(resent["tool"]) == {"ledger.append"}
