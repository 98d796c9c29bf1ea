"""The replay's scenario and its comparison, on their own (lab.replay.build, .compare): the
clients scripted as recorded, the faults pinned to the firings chosen, what cannot be
pinned counted, and "the same failure" said only when rule and culprit both hold."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from lab.faults.plan import parse_plan
from lab.load.settings import ClientScript
from lab.replay.build import choose_triggers, replay_scenario, rule_ids
from lab.replay.compare import outcomes, refired, replay_json, summary_lines
from lab.replay.recorded import Recorded, ReplayError
from lab.scenario import load_scenario
from lab.scenario.write import scenario_toml

SCENARIO: dict[str, Any] = {
    "description": "a recorded run",
    "seed": 4,
    "target": {"kind": "reference", "protocol_version": "2025-11-25", "tokens": {"tok-a": "alice"}},
    "load": {"users": 3, "spawn_rate": 3, "duration": "20s", "hard_timeout": "60s", "event_target": 500,
             "mix": {"read": 1, "stream": 1, "write": 1}, "ticker": {"count": 6, "interval": "10ms"}},
    "faults": [
        {"kind": "cut_stream", "rate": 0.05, "match": {"tools": ["ticker"]}, "params": {"min_index": 2}},
        {"kind": "rewrite_origin", "rate": 0.02, "window": {"start": "1s"}},
        {"kind": "drop_priming", "id": "no-prime", "rate": 0.2},
        {"kind": "kill_session", "rate": 0.1},
    ],
    "toxics": [{"kind": "latency", "at": "2s", "until": "5s", "attributes": {"latency": 200}}],
}  # fmt: skip


def trigger(fault: str, rule: str, client: str | None, request: str | None, ordinal: int | None,
            event: int | None = None, by: str = "request") -> dict[str, Any]:  # fmt: skip
    return {"fault": fault, "rule": rule, "by": by, "client": client, "request": request, "ordinal": ordinal,
            "event_index": event}  # fmt: skip


TRIGGERS = [
    trigger("cut_stream", "cut_stream#0", "w0-u1", "POST tools/call ticker", 2, 3, "event"),
    trigger("drop_priming", "no-prime", "w0-u2", "POST tools/call echo", 1, 0, "event"),
    trigger("rewrite_origin", "rewrite_origin#1", "w0-u2", "POST tools/call echo", 2),
    {
        **trigger("rewrite_origin", "rewrite_origin#1", "w0-u3", "POST tools/call ledger.append", 1),
        "attempt": 2,
    },
    trigger("rewrite_origin", "rewrite_origin#1", None, None, None, by="time"),
    trigger("toxic:latency", "None", None, None, None, by="time"),
]
SCRIPTS = (
    ClientScript("w0-u1", ("stream", "stream", "write"), (0.5, 1.25, 3.0)),
    ClientScript("w0-u2", ("read", "read"), (0.7, 2.0)),
    ClientScript("w0-u3", ("write",), (1.0,)),
)


def recorded(tmp_path: Path) -> Recorded:
    run = {"run_id": "r1", "seed": 99, "started_at": 100.0, "client": "lab", "target": {"kind": "reference"}}
    return Recorded(tmp_path, run, tmp_path / "s.toml", SCENARIO, SCRIPTS, tuple(TRIGGERS), None)


def test_the_replay_scripts_every_client_and_pins_every_firing_it_can(tmp_path: Path) -> None:
    doc, sel = replay_scenario(recorded(tmp_path))
    assert doc["seed"] == 99  # the run's seed (an override included), not the file's
    load = doc["load"]
    assert [c["id"] for c in load["clients"]] == ["w0-u1", "w0-u2", "w0-u3"]
    assert load["clients"][0] == {"id": "w0-u1", "ops": ["stream", "stream", "write"], "at": [0.5, 1.25, 3.0]}
    assert "users" not in load and "event_target" not in load and "mix" not in load and load["workers"] == 1
    faults = {f["id"]: f for f in doc["faults"]}
    assert set(faults) == {"cut_stream#0", "no-prime", "rewrite_origin#1"}  # kill_session never fired
    assert faults["cut_stream#0"]["at"] == [
        {"client": "w0-u1", "request": "POST tools/call ticker", "ordinal": 2, "event": 3}
    ]
    # drop_priming is a flow-level kind: pinned to its request, not to the event it dropped.
    assert faults["no-prime"]["at"] == [{"client": "w0-u2", "request": "POST tools/call echo", "ordinal": 1}]
    # A firing on a re-send is pinned to that attempt of its call.
    assert faults["rewrite_origin#1"]["at"] == [
        {"client": "w0-u2", "request": "POST tools/call echo", "ordinal": 2},
        {"client": "w0-u3", "request": "POST tools/call ledger.append", "ordinal": 1, "attempt": 2},
    ]
    assert "rate" not in faults["rewrite_origin#1"] and "window" not in faults["rewrite_origin#1"]
    assert faults["cut_stream#0"]["params"] == {"min_index": 2} and doc["toxics"] == SCENARIO["toxics"]
    assert (sel.pinned, sel.by_time, sel.not_replayed, sel.toxics) == (4, 2, 1, True)
    # What it writes loads as a scenario, and its plan pins what it says.
    path = tmp_path / "replay.toml"
    path.write_text(scenario_toml(doc), encoding="utf-8")
    assert tomllib.loads(path.read_text(encoding="utf-8"))["faults"] == doc["faults"]
    sc = load_scenario(str(path))
    plan = parse_plan(sc.fault_plan_json(0.0))
    assert sorted(len(r.pins) for r in plan.rules) == [1, 1, 2]
    assert max(p.attempt for r in plan.rules for p in r.pins) == 2


def test_a_subset_of_clients_keeps_only_their_firings(tmp_path: Path) -> None:
    doc, sel = replay_scenario(recorded(tmp_path), clients=["w0-u2"])
    assert [c["id"] for c in doc["load"]["clients"]] == ["w0-u2"]
    assert {f["id"] for f in doc["faults"]} == {"no-prime", "rewrite_origin#1"}
    assert sel.clients == ["w0-u2"]


def test_a_subset_of_faults_by_kind_rule_or_line(tmp_path: Path) -> None:
    doc, sel = replay_scenario(recorded(tmp_path), faults=["cut_stream"])
    assert [f["id"] for f in doc["faults"]] == ["cut_stream#0"] and "toxics" not in doc and not sel.toxics
    doc, _ = replay_scenario(recorded(tmp_path), faults=["no-prime", "3"])
    assert [f["id"] for f in doc["faults"]] == ["rewrite_origin#1", "no-prime"]
    assert [t["rule"] for t in choose_triggers(TRIGGERS, ["toxic:latency"])] == ["None"]


@pytest.mark.parametrize(
    ("clients", "faults", "says"),
    [
        (["w9-u9"], None, "did nothing in the run: w9-u9"),
        (None, ["storm"], "never fired in the run: storm"),
        (None, ["77"], "never fired in the run: 77"),
    ],
)
def test_a_subset_that_is_not_in_the_run_is_refused(
    tmp_path: Path, clients: list[str] | None, faults: list[str] | None, says: str
) -> None:
    with pytest.raises(ReplayError, match=says):
        replay_scenario(recorded(tmp_path), clients=clients, faults=faults)


def test_rule_ids_as_the_scenario_reader_gives_them() -> None:
    assert rule_ids(SCENARIO["faults"]) == ["cut_stream#0", "rewrite_origin#1", "no-prime", "kill_session#3"]


def report(**rules: tuple[str, dict[str, int]]) -> dict[str, Any]:
    return {"rules": {k: {"verdict": v, "attribution_counts": c} for k, (v, c) in rules.items()}}


def test_the_same_failure_needs_the_same_rule_and_culprit() -> None:
    original = report(cross_stream=("fail", {"server": 15, "client": 2}), illegal_origin=("pass", {}))
    same = report(cross_stream=("fail", {"server": 3, "client": 0}), illegal_origin=("pass", {}))
    other_culprit = report(cross_stream=("fail", {"server": 0, "client": 4}))
    gone = report(cross_stream=("pass", {"server": 0}), illegal_origin=("fail", {"server": 1}))
    assert outcomes(original)["cross_stream"].culprit == "server"

    def doc(replay: dict[str, Any]) -> dict[str, Any]:
        return doc_of(original, replay)

    assert doc(same)["reproduced"] and doc(same)["rules"][0]["same"]
    assert not doc(other_culprit)["reproduced"]
    assert not doc(gone)["reproduced"] and doc(gone)["new_failures"] == ["illegal_origin"]
    assert not doc(original | {"rules": {}})["reproduced"]
    # Two failing rules, one back: partly reproduced, and the summary names which.
    both = report(cross_stream=("fail", {"server": 15}), reconnect_storm=("fail", {"client": 3}))
    partly = doc_of(both, report(cross_stream=("fail", {"server": 2}), reconnect_storm=("pass", {})))
    assert not partly["reproduced"] and partly["reproduced_rules"] == ["cross_stream"]
    assert summary_lines(partly)[-1].startswith(
        "partly reproduced: cross_stream came back; reconnect_storm did not"
    )
    assert summary_lines(doc(same))[-1].startswith("reproduced (")
    assert summary_lines(doc(gone))[-1].startswith("not reproduced (")


def doc_of(original: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    return replay_json(
        "a", "b", original, replay, TRIGGERS, [], clients=["w0-u1"], pinned=3, by_time=2, not_replayed=1
    )


def test_triggers_fired_again_are_matched_by_request_and_event_not_time() -> None:
    again = [dict(t, at_s=99.0, conn="other:7", decision="d_x") for t in TRIGGERS[:2]]
    moved = [dict(TRIGGERS[0], event_index=4)]  # the same request, another event: not the same trigger
    assert refired(TRIGGERS, again) == 2
    assert refired(TRIGGERS, moved) == 0
    assert refired(TRIGGERS, [TRIGGERS[4], TRIGGERS[4]]) == 1  # a toxic by its kind, each once
