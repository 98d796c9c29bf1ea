"""Replicas behind the lab's proxy (`target.replicas`, lab.faults.balance), with every real
part: three reference servers and the proxy balancing over them.

- Round robin over replicas that each keep their own sessions: sessions are answered 404
  by replicas that never had them, and check 14 fails on the topology (the servers keep
  the rules: no server or client blame).
- Session affinity, or one store shared by every replica: no session lost, check 14
  passes, with evidence.
The tap records which replica answered each request, and every replica answered some.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.livesrv import run_scenario

pytestmark = pytest.mark.live

SCENARIO = """
description = "replicas {affinity} {store}"
seed = 44

[target]
kind = "reference"
replicas = 3
affinity = "{affinity}"
store = "{store}"

[load]
users = 6
spawn_rate = 6
duration = "8s"
hard_timeout = "60s"
wait_min = "100ms"
wait_max = "300ms"

[load.mix]
read = 2
write = 1
"""


@pytest.mark.parametrize(
    ("affinity", "store", "verdict"),
    [("none", "volatile", "fail"), ("session", "volatile", "pass"), ("none", "shared", "pass")],
)
def test_sessions_are_lost_by_routing_only_without_affinity_or_a_shared_store(
    tmp_path: Path, affinity: str, store: str, verdict: str
) -> None:
    done, run = run_scenario(
        tmp_path, f"replicas-{affinity}-{store}", SCENARIO.format(affinity=affinity, store=store)
    )
    said = done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((run / "run.json").read_text())
    assert doc["complete"], (doc["end_reason"], said)
    servers = sorted(p["name"] for p in doc["processes"] if p["name"].startswith("server"))
    assert servers == (["server"] if store == "shared" else ["server", "server-2", "server-3"]), servers
    answered = Counter(
        rec.get("replica")
        for line in (run / "proxy" / "tap.jsonl").read_text().splitlines()
        if (rec := json.loads(line)).get("type") == "flow" and rec.get("status") is not None
    )
    assert {0, 1, 2} <= set(answered), answered  # every replica answered requests
    rule = json.loads((run / "report.json").read_text())["rules"]["session_routing"]
    assert rule["verdict"] == verdict, (rule, said)
    if verdict == "fail":
        assert rule["measured"]["lost_by_routing"] > 0
        assert rule["attribution_counts"] == {"topology": rule["measured"]["lost_by_routing"]}
        assert "Lost by routing" in rule["witnesses"][0]["explanation"]
    else:
        assert rule["measured"]["lost_by_routing"] == 0 and rule["measured"]["requests_judged"] > 0
