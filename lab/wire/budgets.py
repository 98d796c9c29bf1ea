"""The budgets of the gate table, as the specification sets them: the one place they are
written. A scenario that says nothing of a budget gets these (lab.scenario), and so does a
run.json that says nothing (the checker, lab.checker.context)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

RESUME_P99_S = 5.0
"""Resume latency p99 must stay below this (s)."""
CROSS_STREAM_MAX = 0
DUPLICATE_DISPATCH_MAX = 0
MISSING_REHANDSHAKE_MAX = 0
ORIGIN_REJECT_RATE = 1.0
"""Illegal-Origin requests rejected: 100 %."""
GATE_EVENTS = 100_000
"""The gate table's budgets hold over this many events (the release gate's `min_events`)."""

SPEC_BUDGETS: Mapping[str, float | int] = MappingProxyType(
    {
        "resume_p99_s": RESUME_P99_S,
        "cross_stream_max": CROSS_STREAM_MAX,
        "duplicate_dispatch_max": DUPLICATE_DISPATCH_MAX,
        "missing_rehandshake_max": MISSING_REHANDSHAKE_MAX,
        "origin_reject_rate": ORIGIN_REJECT_RATE,
    }
)
"""Budget name (run.json `budgets`) -> the specification's value."""
