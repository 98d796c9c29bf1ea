"""Reconnect attempts per second: the one definition, for gate 6, the report's figure, the
phases and `lab run`'s progress line.

    per_second(reconnects)   attempts per 1 s bin (floor of the epoch second), all workers merged
    over_budget(counts, budget)   the bins above the budget
    WAIT_ALLOWANCE_S         float rounding allowed when a wait is compared with its advice
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

WAIT_ALLOWANCE_S = 0.001


def per_second(reconnects: pd.DataFrame | Sequence[float] | np.ndarray) -> pd.Series:
    """Reconnect attempts per 1 s bin (index: bin start, epoch s, int), bins in order.

    Takes the `reconnects` rows (their `sent_at`) or the `sent_at` times themselves: the
    one definition of "reconnects per second", used by this gate, the report's figure
    and `lab run`'s progress line."""
    times = reconnects["sent_at"] if isinstance(reconnects, pd.DataFrame) else reconnects
    values = np.asarray(times, dtype="float64")
    if not len(values):
        return pd.Series(dtype="int64")
    bins = np.floor(values).astype("int64")
    return pd.Series(bins).value_counts().sort_index()


def over_budget(counts: pd.Series, budget: float | None) -> pd.Series:
    """The bins of `per_second` above the budget (the gate's violations)."""
    return counts[counts > budget] if budget is not None else counts.iloc[0:0]
