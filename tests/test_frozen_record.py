"""`frozen_record` behaves as `@dataclass(frozen=True, slots=True)` in everything but the
run-time guard against assignment, which the type checker keeps (see the ignore below:
with `warn_unused_ignores`, mypy fails this file if the assignment stops being an error)."""

from __future__ import annotations

import dataclasses

from lab.client import DedupKey
from lab.wire.frozen import frozen_record
from lab.wire.sse import SseEvent


@frozen_record
class Point:
    x: int
    y: str = "a"


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenPoint:
    x: int
    y: str = "a"


def test_equality_hash_repr_and_helpers_are_a_frozen_dataclass_s() -> None:
    p, f = Point(1), FrozenPoint(1)
    assert p == Point(1, "a") and p != Point(2) and p != f  # type: ignore[comparison-overlap]
    assert hash(p) == hash(f) == hash(Point(1))
    assert {p, Point(1)} == {p}
    assert repr(p) == "Point(x=1, y='a')"
    assert dataclasses.replace(p, y="b") == Point(1, "b")
    assert dataclasses.asdict(p) == dataclasses.asdict(f)
    assert [x.name for x in dataclasses.fields(p)] == ["x", "y"]
    assert not hasattr(p, "__dict__")  # slotted


def test_the_per_event_records_are_hashable_by_value() -> None:
    key = DedupKey(1, "get:1", "e1", "d" * 64)
    assert hash(key) == hash(DedupKey(1, "get:1", "e1", "d" * 64))
    assert SseEvent("x", id="1") == SseEvent("x", id="1")


def assign(p: Point) -> None:
    """Never called: mypy must refuse this assignment (a frozen field)."""
    p.x = 2  # type: ignore[misc]
