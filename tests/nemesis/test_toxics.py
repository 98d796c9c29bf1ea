"""Toxic parsing and validation (`lab.nemesis.toxics`), on its own."""

from __future__ import annotations

import math

import pytest

from lab.nemesis.toxics import KIND_ATTRIBUTES, make_toxic, parse_toxic, parse_toxic_update


def test_defaults_follow_toxiproxy() -> None:
    spec = parse_toxic({"type": "latency", "attributes": {"latency": 100}})
    assert (spec.name, spec.kind, spec.stream, spec.toxicity) == (
        "latency_downstream",
        "latency",
        "downstream",
        1.0,
    )
    assert dict(spec.attributes) == {"latency": 100, "jitter": 0}, "missing attributes are 0"
    assert parse_toxic({"type": "timeout"}).attributes == {"timeout": 0}
    assert parse_toxic({"type": "slow_close", "stream": "UPSTREAM"}).name == "slow_close_upstream"


@pytest.mark.parametrize(
    ("kind", "attributes"),
    [
        ("latency", {"latency": 200, "jitter": 50}),
        ("bandwidth", {"rate": 1}),
        ("slow_close", {"delay": 10}),
        ("timeout", {"timeout": 0}),
        ("reset_peer", {"timeout": 1000}),
        ("limit_data", {"bytes": 0}),
        ("slicer", {"average_size": 64, "size_variation": 63, "delay": 10}),
        ("idle_timeout", {"timeout": 60_000}),
        ("buffer", {"size": 8192, "flush": 250}),
        ("header_hold", {}),
    ],
)
def test_every_kind_round_trips_through_json(kind: str, attributes: dict[str, int]) -> None:
    spec = parse_toxic(
        {"name": "t", "type": kind, "stream": "upstream", "toxicity": 0.25, "attributes": attributes}
    )
    assert set(spec.attributes) == set(KIND_ATTRIBUTES[kind])
    assert parse_toxic(spec.to_json()) == spec
    assert spec.to_json()["attributes"] == {**dict.fromkeys(KIND_ATTRIBUTES[kind], 0), **attributes}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"type": "latency", "attributes": {"latency": -1}}, "latency.latency must be >= 0"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": True}}, "must be an integer"),
        ({"type": "latency", "attributes": {"latency": "100"}}, "must be an integer"),
        ({"type": "latency", "attributes": {"latncy": 100}}, "unknown attribute of latency: 'latncy'"),
        ({"type": "latency", "attributes": [100]}, "attributes must be a JSON object"),
        ({"type": "latency", "attributes": {"latency": 2**63}}, "too large"),
        ({"type": "gremlins"}, "invalid toxic type 'gremlins'"),
        ({"type": 7}, "invalid toxic type 7"),
        ({"attributes": {}}, "missing required field: type"),
        ({"type": "latency", "stream": "sideways"}, "stream was invalid"),
        ({"type": "latency", "toxicity": 1.5}, "toxicity must be in 0..1"),
        ({"type": "latency", "toxicity": -0.1}, "toxicity must be in 0..1"),
        ({"type": "latency", "toxicity": math.nan}, "toxicity must be in 0..1"),
        ({"type": "latency", "toxicity": "high"}, "toxicity must be a number"),
        ({"type": "latency", "name": ""}, "toxic name must not be empty"),
        ({"type": "latency", "name": "a/b"}, "must not contain '/'"),
        ({"type": "latency", "toxicty": 1}, "unknown toxic field: 'toxicty'"),
        ({"type": "bandwidth", "attributes": {"rate": 0}}, "bandwidth.rate must be >= 1"),
        ({"type": "slicer", "attributes": {"average_size": 0}}, "slicer.average_size must be >= 1"),
        ({"type": "idle_timeout"}, "idle_timeout.timeout must be >= 1"),
        ({"type": "buffer", "attributes": {"flush": 100}}, "buffer.size must be >= 1"),
        (
            {"type": "slicer", "attributes": {"average_size": 10, "size_variation": 10}},
            "must be smaller than",
        ),
        ([], "a toxic must be a JSON object"),
    ],
)
def test_bad_toxics_are_refused_with_a_clear_message(body: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_toxic(body)


def test_update_merges_attributes_and_keeps_identity() -> None:
    spec = make_toxic("latency", name="slow", latency=100, jitter=10)
    updated = parse_toxic_update(spec, {"attributes": {"jitter": 0}, "toxicity": 0.5})
    assert (updated.name, updated.kind, updated.stream) == ("slow", "latency", "downstream")
    assert dict(updated.attributes) == {"latency": 100, "jitter": 0} and updated.toxicity == 0.5
    assert parse_toxic_update(spec, {"name": "slow", "type": "latency"}) == spec, "repeating identity is fine"
    with pytest.raises(ValueError, match="cannot change"):
        parse_toxic_update(spec, {"stream": "upstream"})
    with pytest.raises(ValueError, match=">= 0"):
        parse_toxic_update(spec, {"attributes": {"latency": -3}})
    with pytest.raises(ValueError, match="unknown attribute"):
        parse_toxic_update(spec, {"attributes": {"rate": 3}})


def test_attributes_are_read_only() -> None:
    spec = make_toxic("limit_data", bytes=10)
    with pytest.raises(TypeError):
        spec.attributes["bytes"] = 20  # type: ignore[index]
    assert spec.attribute("bytes") == 10


def test_make_toxic_validates_like_the_api() -> None:
    assert make_toxic("reset_peer", stream="upstream", timeout=5).to_json() == {
        "name": "reset_peer_upstream",
        "type": "reset_peer",
        "stream": "upstream",
        "toxicity": 1.0,
        "attributes": {"timeout": 5},
    }
    with pytest.raises(ValueError, match="unknown attribute of timeout"):
        make_toxic("timeout", delay=5)
