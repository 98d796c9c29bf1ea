"""Faults pinned to logical triggers (lab.faults.pins), on their own: the plan reads `at`
and refuses what cannot be met; the proxy's counter places each request as the checker's
triggers name it; a pinned rule fires at its pins and nowhere else (flow and event level)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lab.faults.events import EventFaults
from lab.faults.facts import RequestFacts, RpcFacts
from lab.faults.flows import FlowFaults
from lab.faults.kinds.base import ProxyEnv
from lab.faults.memory import Memory
from lab.faults.pins import FixedIndexes, Ordinals, Pin, client_of, request_kind
from lab.faults.plan import ActivePlan, PlanError, PlanHolder, parse_plan
from lab.wire.sse import SseEvent

TICKER = RequestFacts(
    flow="f1",
    key="w0-u4:7",
    conn="w0-u4:7",
    http_method="POST",
    path="/mcp",
    session_id="raw",
    session="s_x",
    rpc=RpcFacts(3, "tools/call", "ticker"),
    origin=None,
    last_event_id=None,
    protocol_version="2025-11-25",
    token=None,
)


def plan_of(*rules: dict[str, Any]) -> ActivePlan:
    return ActivePlan(parse_plan({"seed": 3, "rules": list(rules)}), 0.0, 1)


def test_request_kinds_and_clients_as_triggers_name_them() -> None:
    assert request_kind("POST", "tools/call", "ticker", False) == "POST tools/call ticker"
    assert request_kind("POST", "initialize", None, False) == "POST initialize"
    assert request_kind("POST", None, None, False) == "POST"
    assert request_kind("GET", None, None, True) == "GET resume"
    assert request_kind("GET", None, None, False) == "GET"
    assert request_kind("DELETE", None, None, False) == "DELETE"
    assert client_of("w0-u4:7") == "w0-u4"
    assert client_of("a:b:3") == "a:b"  # the split is at the last ':'
    assert client_of("no-conn-number") is None and client_of(None) is None


def test_ordinals_count_each_clients_requests_by_kind() -> None:
    ordinals = Ordinals()
    echo = replace(TICKER, rpc=RpcFacts(4, "tools/call", "echo"))
    other = replace(TICKER, conn="w0-u5:1", key="w0-u5:1")
    anon = replace(TICKER, conn=None, key="anon:x")
    places = [ordinals.place(f) for f in (TICKER, echo, TICKER, other, anon, TICKER)]
    assert places == [
        ("w0-u4", "POST tools/call ticker", 1, 1),
        ("w0-u4", "POST tools/call echo", 1, 1),
        ("w0-u4", "POST tools/call ticker", 2, 1),
        ("w0-u5", "POST tools/call ticker", 1, 1),
        None,
        ("w0-u4", "POST tools/call ticker", 3, 1),
    ]


def test_a_resend_is_its_calls_next_attempt_not_a_new_ordinal() -> None:
    # The 2nd write was lost and sent again twice (same idempotency key, new JSON-RPC id):
    # the 3rd write is still the 3rd, whatever the faults before it made the client re-send.
    def write(rid: int, key: str) -> RequestFacts:
        return replace(TICKER, rpc=RpcFacts(rid, "tools/call", "ledger.append", key))

    ordinals = Ordinals()
    sends = [write(1, "k1"), write(2, "k2"), write(3, "k2"), write(4, "k2"), write(5, "k3")]
    assert [ordinals.place(f) for f in sends] == [
        ("w0-u4", "POST tools/call ledger.append", 1, 1),
        ("w0-u4", "POST tools/call ledger.append", 2, 1),
        ("w0-u4", "POST tools/call ledger.append", 2, 2),
        ("w0-u4", "POST tools/call ledger.append", 2, 3),
        ("w0-u4", "POST tools/call ledger.append", 3, 1),
    ]
    # The same key from another client, or on another kind of request, is a call of its own.
    other_client = ordinals.place(replace(write(6, "k1"), conn="w0-u5:2"))
    other_kind = ordinals.place(replace(TICKER, rpc=RpcFacts(7, "tools/call", "echo", "k1")))
    assert other_client == ("w0-u5", "POST tools/call ledger.append", 1, 1)
    assert other_kind == ("w0-u4", "POST tools/call echo", 1, 1)


def test_a_pin_on_a_resend_fires_on_that_attempt_only() -> None:
    active = plan_of(
        {
            "kind": "strip_protocol_version",
            "at": [
                {"client": "w0-u4", "request": "POST tools/call ledger.append", "ordinal": 1, "attempt": 2}
            ],
        }
    )
    assert active.plan.rules[0].pins == (Pin("w0-u4", "POST tools/call ledger.append", 1, None, 2),)
    assert parse_plan(active.plan.to_json()) == active.plan
    ordinals = Ordinals()
    send = replace(TICKER, rpc=RpcFacts(1, "tools/call", "ledger.append", "k1"))
    fired = [_fires(active, ordinals, replace(send, rpc=replace(send.rpc, id=i))) for i in range(3)]
    assert fired == [[], ["strip_protocol_version"], []]


def test_the_plan_reads_pins_and_round_trips_them() -> None:
    active = plan_of(
        {
            "kind": "cut_stream",
            "at": [{"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 2, "event": 3}],
        },
        {"kind": "strip_protocol_version", "at": [{"client": "w0-u4", "request": "GET", "ordinal": 1}]},
    )
    cut, strip = active.plan.rules
    assert cut.pins == (Pin("w0-u4", "POST tools/call ticker", 2, 3),) and cut.rate == 1.0
    assert strip.pins == (Pin("w0-u4", "GET", 1),)
    again = parse_plan(active.plan.to_json())
    assert again == active.plan
    assert active.pinned and not plan_of({"kind": "cut_stream", "rate": 0.1}).pinned


@pytest.mark.parametrize(
    ("rule", "key", "says"),
    [
        ({"kind": "cut_stream"}, "rules[0].rate", "or `at`"),
        ({"kind": "cut_stream", "at": []}, "rules[0].at", "non-empty list"),
        ({"kind": "cut_stream", "at": [{"client": "c", "request": "GET", "ordinal": 1}]}, "rules[0].at[0].event", "required"),
        ({"kind": "strip_protocol_version", "at": [{"client": "c", "request": "GET", "ordinal": 1, "event": 2}]}, "rules[0].at[0].event", "not on an event"),
        ({"kind": "cut_stream", "at": [{"client": "c", "request": "GET", "ordinal": 0, "event": 1}]}, "rules[0].at[0].ordinal", ">= 1"),
        ({"kind": "cut_stream", "at": [{"request": "GET", "ordinal": 1, "event": 1}]}, "rules[0].at[0].client", "required"),
        ({"kind": "cut_stream", "at": [{"client": "c", "request": "GET", "ordinal": 1, "event": 1, "when": 3}]}, "rules[0].at[0].when", ""),
    ],
)  # fmt: skip
def test_a_pin_that_cannot_be_met_is_refused_by_key(rule: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(PlanError) as e:
        parse_plan({"seed": 1, "rules": [rule]})
    assert any(i.key == key and says in i.message for i in e.value.issues), e.value.issues


def test_two_pinned_rules_of_one_kind_do_not_contradict() -> None:
    pin = {"client": "c", "request": "GET", "ordinal": 1}
    plan_of(
        {"kind": "strip_protocol_version", "id": "a", "at": [pin]},
        {"kind": "strip_protocol_version", "id": "b", "at": [{**pin, "ordinal": 2}]},
    )
    with pytest.raises(PlanError, match="overlaps"):
        parse_plan(
            {
                "seed": 1,
                "rules": [
                    {"kind": "strip_protocol_version", "id": "a", "rate": 0.5},
                    {"kind": "strip_protocol_version", "id": "b", "rate": 0.2},
                ],
            }
        )


def _fires(active: ActivePlan, ordinals: Ordinals, facts: RequestFacts) -> list[str]:
    ff = FlowFaults(facts)
    ff.on_request(active, ProxyEnv(), {"mcp-protocol-version": "x"}, Memory(), lambda t: t, 1.0, ordinals)
    return [str(f["fault"]) for f in ff.faults]


def test_a_pinned_flow_rule_fires_at_its_pin_only() -> None:
    active = plan_of(
        {
            "kind": "strip_protocol_version",
            "at": [{"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 2}],
        }
    )
    ordinals = Ordinals()
    fired = [_fires(active, ordinals, TICKER) for _ in range(4)]
    assert fired == [[], ["strip_protocol_version"], [], []]
    # Another client's 2nd ticker call is not the pin.
    other = replace(TICKER, conn="w0-u5:1", key="w0-u5:1")
    assert [_fires(active, ordinals, other) for _ in range(2)] == [[], []]


def test_without_the_counter_a_pinned_rule_never_fires() -> None:
    # (A rate rule is unaffected by pins: drawn as ever.)
    active = plan_of(
        {
            "kind": "strip_protocol_version",
            "at": [{"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 1}],
        }
    )
    ff = FlowFaults(TICKER)
    ff.on_request(active, ProxyEnv(), {"mcp-protocol-version": "x"}, Memory(), lambda t: t, 1.0)
    assert ff.faults == []


def _event_faults(active: ActivePlan, place: tuple[str, str, int, int] | None) -> list[int]:
    faults = EventFaults(TICKER, PlanHolder(active), Memory(), [], place=place)
    hit = []
    for i in range(12):
        out = faults(i, SseEvent(data="{}", id=f"id{i}"), None, "d", 1.0)
        if out is not None and out.cut is not None:
            hit.append(i)
    return hit


def test_a_pinned_event_rule_fires_at_its_indexes_on_its_request_only() -> None:
    pins = [
        {"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 2, "event": 7},
        {"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 2, "event": 3},
        {"client": "w0-u4", "request": "POST tools/call ticker", "ordinal": 3, "event": 5},
    ]
    active = plan_of({"kind": "cut_stream", "at": pins})
    assert _event_faults(active, ("w0-u4", "POST tools/call ticker", 2, 1)) == [3, 7]
    assert _event_faults(active, ("w0-u4", "POST tools/call ticker", 3, 1)) == [5]
    assert _event_faults(active, ("w0-u4", "POST tools/call ticker", 1, 1)) == []
    assert _event_faults(active, None) == []


def test_fixed_indexes_answer_as_a_sampler_does() -> None:
    s = FixedIndexes((9, 2, 2, 5))
    assert s.next == 2
    assert [i for i in range(12) if s.hits(i)] == [2, 5, 9]
    assert s.next == FixedIndexes.NEVER
    skipping = FixedIndexes((2, 5))
    assert not skipping.hits(4) and skipping.hits(5)  # an index skipped is gone, as a sampler's


def test_an_at_of_the_wrong_type_is_said_once() -> None:
    with pytest.raises(PlanError) as e:
        parse_plan({"seed": 1, "rules": [{"kind": "cut_stream", "at": "w0-u4"}]})
    said = [i.message for i in e.value.issues if i.key == "rules[0].at"]
    assert said.count("expected a list of tables, got 'w0-u4'") == 1, said
