"""Gate 5's censoring: a loss that never recovered counts as infinitely slow, unless it was
given no chance — the run stopped, or its own client went away (left, or was stopped),
less than the budget after the loss."""

from __future__ import annotations

import math

import pandas as pd

from lab.checker.truth.recoveries import latencies

BUDGET = 5.0


def recoveries() -> pd.DataFrame:
    rows = [
        # client, path, lost_at, recovered_at
        ("gone-soon", "left", 100.0, None),  # left 1 s after the loss: no chance
        ("stopped-soon", "client_stopped", 100.0, None),  # stopped 2 s after: no chance
        ("gone-late", "left", 100.0, None),  # left 8 s after, never back: counted
        ("waiting", "abandoned", 100.0, None),  # gave up on its own: counted
        ("fine", "resumed", 100.0, 100.4),
    ]
    return pd.DataFrame(rows, columns=["client_id", "path", "lost_at", "recovered_at"])


def test_a_client_that_went_away_within_the_budget_is_censored_later_is_counted() -> None:
    ends = {"gone-soon": 101.0, "stopped-soon": 102.0, "gone-late": 108.0, "waiting": 150.0, "fine": 150.0}
    lat = latencies(recoveries(), BUDGET, stopped_at=200.0, client_ends=ends).set_index("client_id")
    assert lat["censored"].to_dict() == {
        "gone-soon": True,
        "stopped-soon": True,
        "gone-late": False,
        "waiting": False,
        "fine": False,
    }
    latency = lat["latency"].astype(float).to_dict()
    assert math.isinf(latency["gone-late"]) and math.isclose(latency["fine"], 0.4)


def test_without_the_clients_ends_only_the_runs_stop_censors() -> None:
    lat = latencies(recoveries(), BUDGET, stopped_at=103.0).set_index("client_id")
    # The run stopped 3 s after every loss: every never-recovered loss had no chance.
    assert lat["censored"].to_dict() == {
        "gone-soon": True,
        "stopped-soon": True,
        "gone-late": True,
        "waiting": True,
        "fine": False,
    }
    lat = latencies(recoveries(), BUDGET, stopped_at=200.0).set_index("client_id")
    assert not lat["censored"].any()
