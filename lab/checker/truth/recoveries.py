"""Recoveries and their latency, as gate 5 and every other figure of resume latency take
them: computed once per run from the client `recoveries` (the lab's clients; a client
under test has its own from the wire, lab.checker.truth.client_delivery).

    latencies(recoveries, budget_s, stopped_at, client_ends)  each recovery's `latency`
        (s; inf = never recovered) and whether it is `censored` (given no chance)
    run_latencies(ctx)   the run's, cached: gate 5, the lab's limits, the lab-latency
                         section, the phases and the capacity steps read the same frame
    nearest_rank(values, q)   the percentile every latency figure uses
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.inputs.load import RunData

PERCENTILE = 0.99


NEVER_FINISHED = "never_finished"


ENDED_BY_CLIENT = ("left", "client_stopped")


def latencies(
    recoveries: pd.DataFrame,
    budget_s: float,
    stopped_at: float | None,
    client_ends: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """The recoveries with `latency` (s; inf = never recovered) and `censored` columns.

    Censored: never recovered, and given no chance — lost less than the budget before the
    run stopped, or before its own client went away (`client_ends`, from `client_ends()`:
    a client that leaves or is stopped ends what it was recovering, path `left` /
    `client_stopped`). A client gone longer than the budget after the loss had its chance:
    that loss counts as never recovered."""
    out = recoveries.copy()
    lost = out["lost_at"].astype("float64")
    recovered = pd.to_numeric(out["recovered_at"], errors="coerce").astype("float64")
    out["latency"] = (recovered - lost).fillna(math.inf)
    never = recovered.isna()
    censored = never & (stopped_at is not None) & (lost + budget_s > (stopped_at or 0.0))
    if client_ends and "path" in out.columns:
        gone = pd.to_numeric(out["client_id"].astype(str).map(client_ends), errors="coerce").astype("float64")
        by_client = out["path"].isin(ENDED_BY_CLIENT) & (lost + budget_s > gone).fillna(False)
        censored = censored | (never & by_client)
    out["censored"] = censored
    return out


def run_latencies(ctx: Context) -> pd.DataFrame:
    """`latencies` of the run's client `recoveries`, as gate 5 judges them (computed once
    per run: gate 5, the lab's limits and the lab-latency section all read it), with
    `declined`: a loss its client chose not to recover by the retry rule (`declined`),
    left out as a censored one is. Raises `MissingInput` without a recoveries table."""
    rec = ctx.require_client("recoveries")

    def compute() -> pd.DataFrame:
        out = latencies(rec, ctx.budgets.resume_p99_s, ctx.stopped_at, client_ends(ctx.data))
        out["declined"] = declined(out, ctx.data)
        out["censored"] = out["censored"] | out["declined"]
        return out

    return ctx.cached("resume_latencies", compute)


DECLINED_REASON = "not_resent_"
"""The reason a call's outcome is unknown when the retry rule kept its client from
re-sending it (`not_resent_<cause>`: lab.client, and the operations table)."""


def declined(rec: pd.DataFrame, data: RunData) -> np.ndarray:
    """Per recovery: it never recovered because its client declined to re-send the call
    (the retry rule: the call may have run, and its tool was not declared safe to repeat;
    its outcome is reported unknown). That is the client's rule working, not a latency:
    nothing was asked of the target, so there is nothing to time."""
    none = np.zeros(len(rec), dtype=bool)
    if not len(rec) or data.client is None or "operations" in data.client_tables_absent:
        return none
    ops = data.client.get("operations")
    if ops is None or not len(ops) or "reason" not in ops.columns or "operation_key" not in rec.columns:
        return none
    reason = ops["reason"].astype(str)
    keys = set(
        zip(
            ops["client_id"].astype(str)[reason.str.startswith(DECLINED_REASON)],
            ops["operation_key"].astype(str)[reason.str.startswith(DECLINED_REASON)],
            strict=True,
        )
    )
    if not keys:
        return none
    never = pd.to_numeric(rec["recovered_at"], errors="coerce").isna().to_numpy()
    pairs = zip(rec["client_id"].astype(str), rec["operation_key"].astype(str), strict=True)
    return never & np.fromiter((k in keys for k in pairs), dtype=bool, count=len(rec))


def client_ends(data: RunData) -> dict[str, float]:
    """Per client, the last moment its ledger shows it at work (its last exchange's end)."""
    if data.client is None or "http_exchanges" in data.client_tables_absent:
        return {}
    ex = data.client.get("http_exchanges")
    if ex is None or not len(ex):
        return {}
    started = pd.to_numeric(ex["started_at"], errors="coerce")
    t = pd.to_numeric(ex["ended_at"], errors="coerce").fillna(started)
    last = t.groupby(ex["client_id"].astype(str)).max().dropna()
    return {str(k): float(v) for k, v in last.items()}


def nearest_rank(values: np.ndarray, q: float) -> float:
    """The ceil(q n)-th smallest value (q in (0, 1]); NaN for no values."""
    if len(values) == 0:
        return math.nan
    ordered = np.sort(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])
