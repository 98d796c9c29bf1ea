"""Reconnect attempts per second: the one definition, for gate 6, the report's figure, the
phases and `lab run`'s progress line.

    per_second(reconnects)   attempts per 1 s bin (floor of the epoch second), all workers merged
    over_budget(counts, budget)   the bins above the budget
    lab_attempts(ctx), wire_attempts(ctx)   the attempts of the lab's clients (their
                             ledgers) or of a client under test (the wire), in one shape
    WAIT_ALLOWANCE_S         float rounding allowed when a wait is compared with its advice
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import client_ref
from lab.checker.truth import client_wire

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


@dataclass(frozen=True, slots=True)
class Attempts:
    """Reconnect attempts of one run's clients, read from whichever ledgers the run has,
    in one shape (the rule reads this, not the ledgers).

    `frame` columns: `client_id`, `kind`, `t` (sent, epoch s), `lost_at` (the loss it
    answers), `waited_s`, `advised_s` (NaN: no advice), `advice` (what advised it, in
    words), `what` (the stream or flow, in words), and the reading's own columns (among
    them the ones `fields` names and `refs` reads)."""

    frame: pd.DataFrame
    source: str
    """Where the attempts come from, in words (the evidence line)."""
    fields: tuple[str, ...]
    """The columns a witness of a short wait carries."""
    refs: Callable[[pd.Series], list[str]]
    """Where an attempt's raw rows are (computed for witnesses only)."""


def lab_attempts(ctx: Context) -> Attempts:
    """The lab's clients: their `reconnects` ledger rows."""
    rc = ctx.require_client("reconnects")
    files = ctx.data.client_files
    frame = pd.DataFrame(
        {
            "client_id": rc["client_id"],
            "kind": rc["kind"],
            "t": rc["sent_at"].astype("float64"),
            "lost_at": rc["lost_at"].astype("float64"),
            "waited_s": rc["sent_at"].astype("float64") - rc["lost_at"].astype("float64"),
            "advised_s": pd.to_numeric(rc["advised_delay"], errors="coerce"),
            "advice": "the server's advice",
            "what": "of " + rc["stream_key"].astype(str),
            "cause": rc["cause"],
        },
        index=rc.index,
    )
    for column in (
        "stream_key",
        "advised_delay",
        "planned_delay",
        "sent_at",
        "waited",
        "attempt",
        "_src",
        "_rowid",
    ):
        if column in rc.columns:
            frame[column] = rc[column]
    fields = (
        "client_id",
        "kind",
        "stream_key",
        "cause",
        "advised_delay",
        "planned_delay",
        "lost_at",
        "sent_at",
        "waited",
        "attempt",
    )
    return Attempts(
        frame,
        "attempts in the client ledgers",
        fields,
        lambda r: client_ref(files, "reconnects", r),
    )


def wire_attempts(ctx: Context) -> Attempts:
    """A client under test: its attempts as the tap saw them (lab.checker.truth.client_wire)."""
    att = client_wire.attempts(ctx)
    frame = pd.DataFrame(
        {
            "client_id": att["client_id"],
            "kind": att["kind"],
            "t": att["t_req"].astype("float64"),
            "lost_at": att["lost_at"],
            "waited_s": att["waited_s"],
            "advised_s": pd.to_numeric(att["advised_s"], errors="coerce"),
            "advice": att["advice"],
            "what": "",
            "cause": "the loss it answers",
        },
        index=att.index,
    )
    for column in ("flow", "previous", "t_req", "tap_line", "previous_line"):
        if column in att.columns:
            frame[column] = att[column]
    fields = ("client_id", "kind", "flow", "previous", "lost_at", "t_req", "waited_s", "advised_s", "advice")
    return Attempts(
        frame,
        "attempts on the wire (the proxy's record)",
        fields,
        lambda r: client_wire.ref(r) + client_wire.ref(r, "previous_line"),
    )
