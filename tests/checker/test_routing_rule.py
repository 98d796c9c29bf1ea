"""Gate 14 `session_routing`: a session answered 404 by a replica it never belonged to is
lost by routing, the topology's finding, from the tap alone; runs built by hand
(tests/checker/builders.py) with the proxy's `replica` on every flow: the bad case seen
failing, the legal ones passing (every request on the session's own replica; a 404
after the session was deleted), and no verdict at all without replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from tests.checker.builders import Sim, clean_run


def on_replicas(sim: Sim, replica: int = 0) -> None:
    """Every flow so far answered by `replica` (affinity: each session on its own)."""
    for r in sim.tap:
        if r["type"] == "flow":
            r["replica"] = replica


def judge(sim: Sim, tmp_path: Path, replicas: int = 2) -> tuple[RunReport, GateResult | None]:
    run = sim.write(tmp_path / "run", server=False)
    doc = json.loads((run / "run.json").read_text())
    doc["scenario"] = {"name": "built-by-hand", "target": {"kind": "reference", "replicas": replicas}}
    (run / "run.json").write_text(json.dumps(doc))
    _, report = judge_dir(run)
    return report, next((g for g in report.gates if g.gate == "session_routing"), None)


def last_flow(sim: Sim) -> dict[str, Any]:
    return next(r for r in reversed(sim.tap) if r["type"] == "flow")


def test_a_session_answered_404_by_another_replica_is_lost_by_routing(tmp_path: Path) -> None:
    sim = clean_run().sim
    on_replicas(sim, 0)
    sim.request("a", "notify", "POST", 404)  # the balancer sent it to replica 1
    last_flow(sim)["replica"] = 1
    report, g = judge(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.FAIL, g
    assert report.verdict is Verdict.FAIL
    assert g.measured["lost_by_routing"] == 1 and g.attribution_counts == {"topology": 1}
    (w,) = g.witnesses
    assert w.check == "lost_by_routing" and w.attribution is Attribution.TOPOLOGY
    assert w.row["owner"] == 0 and w.row["replica"] == 1
    assert "created by replica 0" in w.explanation and "answered 404 by replica 1" in w.explanation
    assert w.refs and w.refs[0].startswith("proxy/tap.jsonl:")


def test_every_request_on_its_sessions_replica_passes(tmp_path: Path) -> None:
    sim = clean_run().sim
    on_replicas(sim, 0)
    sim.request("b", "notify", "POST", 202)
    last_flow(sim)["replica"] = 0
    _, g = judge(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.PASS, g
    assert g.measured["lost_by_routing"] == 0 and int(str(g.measured["requests_judged"])) > 0


def test_a_404_after_the_session_was_deleted_is_not_routing(tmp_path: Path) -> None:
    sim = clean_run().sim
    on_replicas(sim, 0)
    sim.request("a", "delete", "DELETE", 200)
    last_flow(sim)["replica"] = 0
    sim.request("a", "notify", "POST", 404)
    last_flow(sim)["replica"] = 1  # another replica, but the session had ended
    _, g = judge(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.PASS, g


def test_without_replicas_the_rule_does_not_apply_and_without_their_record_it_has_no_evidence(
    tmp_path: Path,
) -> None:
    sim = clean_run().sim
    on_replicas(sim, 0)
    _, g = judge(sim, tmp_path / "one", replicas=1)
    assert g is None
    bare = clean_run().sim  # replicas configured, but no flow says which answered
    _, g = judge(bare, tmp_path / "bare")
    assert g is not None and g.verdict is Verdict.INCONCLUSIVE, g


def judge_url_target(sim: Sim, tmp_path: Path) -> GateResult | None:
    run = sim.write(tmp_path / "run", server=False)
    doc = json.loads((run / "run.json").read_text())
    doc["target"] = {"kind": "url", "url": "http://127.0.0.1:1/mcp"}
    (run / "run.json").write_text(json.dumps(doc))
    _, report = judge_dir(run)
    return next((g for g in report.gates if g.gate == "session_routing"), None)


def test_a_url_targets_session_served_again_after_a_404_was_lost_by_routing(tmp_path: Path) -> None:
    """Behind a balancer the lab cannot see into: the session was alive (served again on a
    request sent after the 404), so the 404 came from somewhere that did not have it."""
    sim = clean_run().sim
    sim.request("a", "notify", "POST", 404)
    sim.request("a", "notify", "POST", 202)
    g = judge_url_target(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.FAIL, g
    (w,) = g.witnesses
    assert w.check == "answered_404_while_alive" and w.attribution is Attribution.TOPOLOGY
    assert "served again" in w.explanation and "balancer" in w.explanation


def test_a_url_targets_404_to_a_session_it_never_serves_again_passes(tmp_path: Path) -> None:
    sim = clean_run().sim
    sim.request("a", "notify", "POST", 404)  # expired, say: the client starts anew
    g = judge_url_target(sim, tmp_path / "gone")
    assert g is not None and g.verdict is Verdict.PASS, g
    deleted = clean_run().sim
    deleted.request("a", "delete", "DELETE", 200)
    deleted.request("a", "notify", "POST", 404)
    deleted.request("a", "notify", "POST", 202)  # (a target that served it after its DELETE: not routing)
    g = judge_url_target(deleted, tmp_path / "deleted")
    assert g is not None and g.verdict is Verdict.PASS, g
