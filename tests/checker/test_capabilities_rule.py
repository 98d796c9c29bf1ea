"""Check 13 `declared_capabilities`: a server message that needs a capability its session
did not declare at initialize is the server's violation, from the tap alone; runs built by
hand (tests/checker/builders.py), the bad case seen failing and the legal ones passing."""

from __future__ import annotations

import json
from pathlib import Path

from lab.checker.judge.verdict import judge_dir
from lab.checker.model import Attribution, GateResult, RunReport, Verdict
from tests.checker.builders import Sim, Stream, clean_run

SERVER_DECLARES = ["logging", "tools"]


def declare(sim: Sim, client: str, server: list[str], client_caps: list[str] | None = None) -> None:
    """The tap's `capabilities` record of the client's session (what its initialize said)."""
    sim.tap.append(
        {
            "type": "capabilities",
            "flow": f"init-{client}",
            "t": sim.tick(),
            "session": sim.clients[client].session,
            "server": server,
            "client": client_caps or [],
        }
    )


def gated(sim: Sim, st: Stream, method: str) -> None:
    """The server sends `method` on the stream; the tap names it (it needs a capability)."""
    sim.send(st, json.dumps({"jsonrpc": "2.0", "method": method, "params": {"uri": "x://1"}}))
    last = next(r for r in reversed(sim.tap) if r["type"] == "sent")
    last["method"] = method


def judge(sim: Sim, tmp_path: Path) -> tuple[RunReport, GateResult | None]:
    _, report = judge_dir(sim.write(tmp_path / "run", server=False))
    return report, next((g for g in report.gates if g.gate == "declared_capabilities"), None)


def test_a_notification_of_an_undeclared_capability_fails_on_the_server(tmp_path: Path) -> None:
    sim = clean_run().sim
    declare(sim, "a", SERVER_DECLARES)
    declare(sim, "b", SERVER_DECLARES)
    get = sim.open_get("a")
    gated(sim, get, "notifications/message")  # declared: logging
    gated(sim, get, "notifications/resources/updated")  # not declared: resources.subscribe
    report, g = judge(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.FAIL, g
    assert report.verdict is Verdict.FAIL
    assert g.measured["undeclared_capability"] == 1 and g.attribution_counts == {"server": 1}
    assert g.measured["by_method"] == {"notifications/resources/updated": 1}
    (w,) = g.witnesses
    assert w.check == "undeclared_capability" and w.attribution is Attribution.SERVER
    assert w.row["needs"] == "resources.subscribe" and "logging, tools" in w.explanation


def test_a_request_of_a_capability_the_client_did_not_declare_fails(tmp_path: Path) -> None:
    sim = clean_run().sim
    declare(sim, "a", SERVER_DECLARES, client_caps=["roots"])
    get = sim.open_get("a")
    gated(sim, get, "roots/list")  # the client declared roots: fine
    gated(sim, get, "sampling/createMessage")  # it did not declare sampling
    _, g = judge(sim, tmp_path)
    assert g is not None and g.verdict is Verdict.FAIL
    assert [w.row["method"] for w in g.witnesses] == ["sampling/createMessage"]
    assert "the client did not declare" in g.witnesses[0].explanation


def test_declared_capabilities_pass_and_old_taps_are_not_judged(tmp_path: Path) -> None:
    sim = clean_run().sim
    declare(sim, "a", [*SERVER_DECLARES, "resources", "resources.subscribe"])
    gated(sim, sim.open_get("a"), "notifications/resources/updated")
    report, g = judge(sim, tmp_path / "declared")
    assert g is not None
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["sessions_declared"] == 1 and int(str(g.measured["messages_judged"])) > 0
    # A tap without declarations (written before the tap recorded them): the rule is absent.
    report, g = judge(clean_run().sim, tmp_path / "old")
    assert g is None and "declared_capabilities" not in {x.gate for x in report.gates}


def test_a_session_whose_initialize_the_tap_missed_is_not_judged(tmp_path: Path) -> None:
    sim = clean_run().sim
    declare(sim, "a", SERVER_DECLARES)
    gated(sim, sim.open_get("b"), "notifications/resources/updated")  # b's declaration unseen
    _, g = judge(sim, tmp_path)
    assert g is not None
    assert g.verdict is Verdict.PASS, g.summary
    assert g.measured["sessions_without_declaration"] == 1


def _modern_run(server: list[str]) -> Sim:
    """Client a's call stream of the modern era (no session): its client declared at
    server/discover (a `capabilities` record with no session, on a flow of a's), then the
    server sends a log message and a resources notification on the call's stream."""
    sim = clean_run().sim
    st = sim.call("a", 99)
    sim.tap.append(
        {
            "type": "capabilities",
            "flow": st.flow,
            "t": sim.tick(),
            "session": None,
            "server": server,
            "client": [],
        }
    )
    gated(sim, st, "notifications/message")
    gated(sim, st, "notifications/resources/updated")
    for r in sim.tap:
        if r["type"] == "sent" and r["flow"] == st.flow:
            r["session"] = None
    return sim


def test_in_the_modern_era_messages_are_judged_against_their_clients_discover(tmp_path: Path) -> None:
    report, g = judge(_modern_run(SERVER_DECLARES), tmp_path / "bad")
    assert g is not None and g.verdict is Verdict.FAIL and report.verdict is Verdict.FAIL, g
    assert g.measured["undeclared_capability"] == 1 and g.attribution_counts == {"server": 1}
    (w,) = g.witnesses
    assert w.row["session"] is None and w.row["needs"] == "resources.subscribe"
    assert "modern-era" in w.explanation and "at server/discover" in w.explanation
    # The same server declaring resources.subscribe at discover: nothing to find.
    _, ok = judge(_modern_run([*SERVER_DECLARES, "resources", "resources.subscribe"]), tmp_path / "ok")
    assert ok is not None, "check 13 not judged"
    assert ok.measured["undeclared_capability"] == 0, ok.summary
