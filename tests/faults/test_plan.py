"""The fault plan: parsing with every problem named, shapes in time, and seed-derived decisions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lab.faults.checks import parse_duration
from lab.faults.decisions import Decider, Window
from lab.faults.facts import (
    Target,
    bearer_token,
    decision_key,
    origin_allowed,
    rpc_facts,
    stream_kind,
    tampered_id,
)
from lab.faults.kinds import NAMES, REGISTRY, Unit
from lab.faults.kinds.storms import StormParams
from lab.faults.plan import PLAN_SCHEMA, Match, PlanError, Rule, parse_plan


def problems(plan: dict[str, Any]) -> list[str]:
    with pytest.raises(PlanError) as e:
        parse_plan(plan)
    return [str(i) for i in e.value.issues]


def test_a_full_plan_round_trips() -> None:
    raw = {
        "schema": PLAN_SCHEMA,
        "seed": 9,
        "run_start": 100.0,
        "rules": [
            {
                "kind": "storm",
                "rate": 0.5,
                "window": {"start": "10s", "end": "1m"},
                "params": {"shape": "ramp"},
            },
            {"kind": "cut_stream", "rate": 0.01, "id": "cuts", "match": {"streams": ["post", "resume"]}},
            {
                "kind": "rewrite_origin",
                "rate": 1,
                "match": {"methods": ["tools/call"], "http_methods": ["POST"]},
            },
        ],
    }
    plan = parse_plan(raw)
    assert [r.id for r in plan.rules] == ["storm#0", "cuts", "rewrite_origin#2"]
    assert plan.rules[0].window == Window(10.0, 60.0)
    assert plan.rules[1].match.streams == frozenset({"post", "resume"})
    again = parse_plan(plan.to_json())
    assert again == plan and again.digest == plan.digest
    assert parse_plan(json.dumps(raw)) == plan


def test_every_kind_has_a_unit_and_defaults() -> None:
    for name in NAMES:
        plan = parse_plan({"seed": 1, "rules": [{"kind": name, "rate": 0.1, "window": {"end": 5}}]})
        assert plan.rules[0].kind == name and plan.rules[0].unit in (Unit.FLOW, Unit.EVENT)
        assert plan.rules[0].params == REGISTRY[name].params_type()
    assert len(NAMES) == 16


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"kind": "storm"}, "rules[0].rate: required: a number in 0..1"),
        ({"kind": "storm", "rate": 1.5}, "rules[0].rate: expected a number in 0..1, got 1.5"),
        ({"kind": "storm", "rate": "high"}, "rules[0].rate: expected a number in 0..1, got 'high'"),
        ({"kind": "storm", "rate": True}, "rules[0].rate: expected a number in 0..1, got true"),
        ({"rate": 1}, "rules[0].kind: required: one of drop_priming"),
        (
            {"kind": "stomr", "rate": 1},
            "rules[0].kind: unknown fault 'stomr' (did you mean 'storm'?); expected one of drop_priming",
        ),
        ({"kind": "storm", "rat": 1, "rate": 1}, "rules[0].rat: unknown key (did you mean 'rate'?)"),
        (
            {"kind": "storm", "rate": 1, "window": {"start": "10 sec"}},
            "rules[0].window.start: expected a duration",
        ),
        (
            {"kind": "storm", "rate": 1, "window": {"start": 5, "end": 5}},
            "rules[0].window.end: the window must end after",
        ),
        ({"kind": "storm", "rate": 1, "window": "soon"}, "rules[0].window: expected a table, got 'soon'"),
        (
            {"kind": "storm", "rate": 1, "params": {"stauts": 429}},
            "rules[0].params.stauts: unknown key (did you mean 'status'?)",
        ),
        (
            {"kind": "storm", "rate": 1, "params": {"status": 500}},
            "rules[0].params.status: expected 429 or 503, got 500",
        ),
        (
            {"kind": "storm", "rate": 1, "params": {"shape": "wave"}},
            "rules[0].params.shape: expected one of 'sustained'",
        ),
        (
            {"kind": "storm", "rate": 1, "params": {"burst": "20s"}},
            "rules[0].params.burst: the burst (20s) must not be longer",
        ),
        (
            {"kind": "storm", "rate": 1, "params": {"shape": "ramp"}},
            "rules[0].params.ramp: a ramp storm needs a ramp length",
        ),
        (
            {"kind": "storm", "rate": 0.2, "params": {"from_rate": 0.5}},
            "rules[0].params.from_rate: must not exceed",
        ),
        (
            {"kind": "replay_after_ack", "rate": 1, "params": {"depth": 0}},
            "rules[0].params.depth: expected an integer in 1..16, got 0",
        ),
        ({"kind": "drop_priming", "rate": 1, "params": {"x": 1}}, "rules[0].params.x: unknown key"),
        (
            {"kind": "rewrite_origin", "rate": 1, "params": {"origin": "evil"}},
            "rules[0].params.origin: expected an origin",
        ),
        (
            {"kind": "storm", "rate": 1, "match": {"streams": ["post", "put"]}},
            "rules[0].match.streams[1]: expected one of 'post', 'get', 'resume', got 'put'",
        ),
        (
            {"kind": "storm", "rate": 1, "match": {"sessions": ["abc"]}},
            "rules[0].match.sessions[0]: expected a session pseudonym",
        ),
        (
            {"kind": "storm", "rate": 1, "match": {"tools": []}},
            "rules[0].match.tools: expected a non-empty list, each item a tool name, got a list",
        ),
        ({"kind": "storm", "rate": 1, "id": "has space"}, "rules[0].id: expected an ID of letters"),
    ],
)
def test_bad_rules_name_the_key_and_what_was_expected(rule: dict[str, Any], expected: str) -> None:
    got = problems({"seed": 1, "rules": [rule]})
    assert any(p.startswith(expected) for p in got), got


def test_all_problems_are_reported_at_once() -> None:
    got = problems(
        {
            "seed": -1,
            "extra": 1,
            "rules": [
                {"kind": "storm", "rate": 2},
                {"kind": "nope", "rate": 0.5},
                {"kind": "cut_stream", "rate": -1},
            ],
        }
    )
    assert len(got) == 5, got
    assert {p.split(":")[0] for p in got} == {
        "seed",
        "extra",
        "rules[0].rate",
        "rules[1].kind",
        "rules[2].rate",
    }


def test_contradicting_windows_and_duplicate_ids() -> None:
    got = problems(
        {
            "seed": 1,
            "rules": [
                {"kind": "storm", "rate": 0.5, "window": {"start": 0, "end": 30}},
                {"kind": "storm", "rate": 0.9, "window": {"start": 20, "end": 40}},
                {
                    "kind": "storm",
                    "rate": 0.9,
                    "window": {"start": 30, "end": 40},
                    "match": {"streams": ["get"]},
                },
                {"kind": "cut_stream", "rate": 0.1, "id": "storm#0"},
            ],
        }
    )
    assert any(p.startswith("rules[1].window: overlaps rules[0] ('storm#0')") for p in got), got
    assert any(p.startswith("rules[3].id: duplicate rule ID 'storm#0'") for p in got), got
    assert len(got) == 2  # disjoint or differently targeted rules do not contradict


def test_not_json_and_bad_schema() -> None:
    with pytest.raises(PlanError, match="not JSON"):
        parse_plan("{")
    assert problems({"schema": "v0", "seed": 1})[0].startswith("schema: expected 'mcpLabFaultPlan.v1'")


def test_storm_shapes() -> None:
    def rule(**params: Any) -> Rule:
        return Rule("s", "storm", 0.8, Window(10, 50), params=StormParams(**params))

    sustained = rule()
    assert [sustained.probability(t) for t in (5, 10, 49.9, 50)] == [0.0, 0.8, 0.8, 0.0]
    burst = rule(shape="burst", period=10.0, burst=2.0)
    assert [burst.probability(t) for t in (10, 11.9, 12, 20.5, 29)] == [0.8, 0.8, 0.0, 0.8, 0.0]
    ramp = rule(shape="ramp", from_rate=0.2)
    assert ramp.probability(10) == pytest.approx(0.2)
    assert ramp.probability(30) == pytest.approx(0.5)
    assert ramp.probability(49.99) == pytest.approx(0.8, abs=1e-3)
    short = rule(shape="ramp", ramp=4.0)
    assert short.probability(12) == pytest.approx(0.4) and short.probability(20) == pytest.approx(0.8)


def test_match() -> None:
    m = Match(http_methods=frozenset({"GET"}), streams=frozenset({"resume"}))
    assert m.matches(Target("GET", "resume"))
    assert not m.matches(Target("GET", "get"))
    assert not m.matches(Target("POST", "post"))
    assert Match().matches(Target("DELETE", None))
    assert Match(tools=frozenset({"echo"})).matches(Target("POST", "post", "tools/call", "echo"))
    assert not Match(tools=frozenset({"echo"})).matches(Target("POST", "post", "ping"))


def test_decisions_are_derived_from_the_seed() -> None:
    a, b = Decider(1), Decider(1)
    assert a.draw("r", "c1:1#3") == b.draw("r", "c1:1#3")
    assert a.draw("r", "c1:1#3") != Decider(2).draw("r", "c1:1#3")
    assert a.draw("r", "c1:1#3") != a.draw("q", "c1:1#3")
    d = a.draw("r", "k")
    assert d.id.startswith("d_") and len(d.id) == 18 and 0 <= d.draw < 1 and 0 <= d.pick(7) < 7


def test_the_rate_is_the_fraction_that_fires() -> None:
    dec = Decider(3)
    fired = sum(dec.decide("r", 0.1, f"c:{i}") is not None for i in range(20000))
    assert 1800 < fired < 2200
    assert dec.decide("z", 0.0, "c:1") is None
    # Lowering a rate only removes firings.
    assert {i for i in range(2000) if dec.decide("r", 0.05, f"c:{i}") is not None} <= {
        i for i in range(2000) if dec.decide("r", 0.1, f"c:{i}") is not None
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        (12, 12.0),
        (0.25, 0.25),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "30", "30 sec", "-1s", "1d", True, None, [1], -2])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_request_facts() -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "tools/call",
        "params": {"name": "echo", "_meta": {"mcp-lab/idempotency-key": "k"}},
    }
    f = rpc_facts(json.dumps(body).encode())
    assert (f.id, f.method, f.tool, f.idempotency_key, f.is_request) == (4, "tools/call", "echo", "k", True)
    assert rpc_facts(b"[" + json.dumps(body).encode() + b"]").tool == "echo"
    assert rpc_facts(b"{bad").method is None and rpc_facts(None).id is None
    assert rpc_facts(b'{"id": true, "method": "x"}').id is None
    assert not rpc_facts(b'{"method": "notifications/initialized"}').is_request
    assert stream_kind("GET", "x") == "resume" and stream_kind("GET", None) == "get"
    assert stream_kind("POST", None) == "post" and stream_kind("DELETE", None) is None
    assert decision_key("c:1", "POST", "/mcp", f, None) == "c:1"
    anon = decision_key(None, "POST", "/mcp", f, None)
    assert anon.startswith("anon:") and anon == decision_key(None, "POST", "/mcp", f, None)
    assert (
        bearer_token("Bearer abc") == "abc" and bearer_token("Basic x") is None and bearer_token(None) is None
    )
    assert tampered_id("e1.x.A") == "e1.x.B" and tampered_id("e1.x.B") == "e1.x.A"


def test_origin_allow_list_like_the_server() -> None:
    pats = ("http://127.0.0.1:*", "http://localhost")
    assert origin_allowed("http://127.0.0.1:8080", pats)
    assert origin_allowed("HTTP://LOCALHOST", pats)
    assert not origin_allowed("http://127.0.0.1:80.evil.example", pats)
    assert not origin_allowed("http://localhost:1", pats)
