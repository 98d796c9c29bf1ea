"""Retry-After parsing, backoff with jitter, planning, and the reconnect budget."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.client._reconnect import BackoffPolicy, ReconnectBudget, parse_retry_after, plan_reconnect
from lab.wire.errors import LocalProtocolError

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("0", 0.0),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("-3", None),
        ("1.5", None),
        ("soon", None),
        ("Tue, 14 Nov 2023 22:13:50 GMT", 30.0),
        ("Tue, 14 Nov 2023 22:00:00 GMT", 0.0),  # in the past: go now
        ("Tuesday, 14-Nov-23 22:13:25 GMT", 5.0),  # RFC 850
        ("Tue Nov 14 22:13:21 2023", 1.0),  # asctime
        ("Tue, 14 Foo 2023 22:13:50 GMT", None),
        ("Tue, 31 Feb 2023 22:13:50 GMT", None),
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_backoff_grows_is_capped_and_jittered() -> None:
    pol = BackoffPolicy(base=0.5, cap=8.0)
    rng = random.Random(1)
    for attempt in range(12):
        d = min(8.0, 0.5 * 2**attempt)
        samples = [pol.delay(attempt, rng) for _ in range(50)]
        assert all(d / 2 <= s <= d for s in samples)
        assert len(set(samples)) > 1  # jitter: clients do not come back together
    with pytest.raises(LocalProtocolError):
        BackoffPolicy(base=0)


def test_plan_honours_server_advice_as_a_floor() -> None:
    pol, rng = BackoffPolicy(base=0.1, cap=1.0), random.Random(2)
    polling = plan_reconnect(NOW, 0, pol, rng, retry_ms=2500)
    assert polling.delay == 2.5 and polling.at == NOW + 2.5 and polling.advised_delay == 2.5
    storm = plan_reconnect(NOW, 5, pol, rng, retry_after=30.0)
    assert storm.delay == 30.0  # never earlier than Retry-After, even when backoff is shorter
    both = plan_reconnect(NOW, 0, pol, rng, retry_ms=1000, retry_after=4.0)
    assert both.advised_delay == 4.0
    plain = plan_reconnect(NOW, 3, pol, rng)
    assert plain.advised_delay is None and 0.4 <= plain.delay <= 0.8


def test_budget_caps_each_calendar_second() -> None:
    b = ReconnectBudget(3.0, burst=5.0, now=NOW)
    granted = [t for t in (NOW + i * 0.01 for i in range(1000)) if b.try_acquire(t)]
    per_second = Counter(math.floor(t) for t in granted)
    assert max(per_second.values()) <= 3
    assert sum(per_second.values()) >= 3 * 9  # and it does grant: ~rate per second
    s = b.statistics()
    assert s.granted == len(granted) and s.denied == 1000 - len(granted)


def test_budget_rate_can_be_changed_from_outside() -> None:
    b = ReconnectBudget(1.0, now=NOW)
    assert b.try_acquire(NOW)
    assert not b.try_acquire(NOW + 0.1)
    b.set_rate(100.0, NOW + 0.1)
    assert b.bin_cap == 100
    assert b.try_acquire(NOW + 0.2)
    b.set_rate(0.0, NOW + 1.3)
    assert b.try_acquire(NOW + 1.3)  # the token earned before the change is kept
    assert not b.try_acquire(NOW + 5.0)
    assert b.next_available(NOW + 5.0) == math.inf
    with pytest.raises(LocalProtocolError):
        b.set_rate(-1, NOW)


def test_next_available_is_when_acquire_succeeds() -> None:
    b = ReconnectBudget(2.0, now=NOW)
    assert b.try_acquire(NOW)
    t = b.next_available(NOW)
    assert t > NOW
    assert not b.try_acquire(t - 0.01)
    assert b.try_acquire(t)


def test_unlimited_budget() -> None:
    b = ReconnectBudget(math.inf, now=NOW)
    assert all(b.try_acquire(NOW) for _ in range(10_000))


@given(
    st.floats(0.1, 50.0),
    st.lists(st.floats(0.0, 0.2), min_size=1, max_size=300),
    st.floats(1.0, 10.0),
)
def test_budget_never_exceeds_its_per_second_cap(rate: float, gaps: list[float], burst: float) -> None:
    b = ReconnectBudget(rate, burst=burst, now=NOW)
    t = NOW
    per_second: Counter[int] = Counter()
    for g in gaps:
        t += g
        if b.try_acquire(t):
            per_second[math.floor(t)] += 1
    assert max(per_second.values(), default=0) <= max(1, math.floor(rate))
