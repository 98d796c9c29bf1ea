"""Gate 5 for a client under test — resume latency p99 (budget: resume_p99_s).

Each loss is seen on the wire (a stream of a call that ended before serving it whole,
lab.checker.truth.client_delivery `recoveries`); its recovery is the moment the application
next received a message the server sent on that call's streams (its response or a
progress notification), from the application log. A call lost and never answered again
before its outcome — or without any outcome by the end of the run — never recovered and
counts as infinitely slow, unless it was lost less than resume_p99_s before the run
stopped (censored: left out and counted). Calls the wire shows that never got an
outcome at all are listed in the measures (`calls_without_outcome`).

p99 is the nearest-rank percentile (lab.checker.rules.resume). Witnesses: the slowest
recoveries (never-recovered first), not attributed. Evidence: recoveries (censored
excluded) >= min_recoveries.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, finite_or_none, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs, app_ref
from lab.checker.truth.client_delivery import recoveries
from lab.checker.truth.recoveries import PERCENTILE, nearest_rank

TRUTH_FROM = "losses from the wire (proxy tap), recoveries from the application log"


def calls_without_outcome(ctx: Context) -> pd.DataFrame:
    """Calls the wire shows (a tools/call POST with the call's key) with no outcome in any
    application log: client_id, call, first seen (t_req)."""
    flows = client_wire.flows(ctx)
    posts = flows[(flows["rpc_method"] == "tools/call") & flows["key"].notna()]
    first = posts.drop_duplicates("key").rename(columns={"key": "call"})
    done = set(app_logs(ctx).of("outcome")["call"].tolist())
    return first[~first["call"].isin(done)][["client_id", "call", "t_req", "tap_line"]]


def check(ctx: Context) -> GateResult:
    rec = recoveries(ctx)
    budget = ctx.budgets.resume_p99_s
    stopped = ctx.stopped_at
    never = rec["recovered_at"].isna()
    censored = never & (stopped is not None) & (rec["lost_at"] + budget > (stopped or 0.0))
    counted = rec[~censored].copy()
    values = counted["latency_s"].to_numpy(dtype="float64")
    p99 = nearest_rank(values, PERCENTILE)
    n = len(counted)
    need = max(1, ctx.budgets.min_recoveries)
    failed = n > 0 and p99 >= budget
    slow = counted[counted["latency_s"] >= budget].sort_values("latency_s", ascending=False, kind="stable")
    finite = values[np.isfinite(values)]
    stuck = calls_without_outcome(ctx)
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "recoveries", need, n, n >= need, "losses of a call's stream on the wire (censored excluded)"
        ),
    ]
    p99_text = "n/a" if n == 0 else ("never" if math.isinf(p99) else f"{p99:.3f} s")
    return GateResult(
        verdict=decide(failed, evidence),
        summary=f"p99 {p99_text} over {n} recoveries (budget < {budget:g} s); {int(never.sum())} never recovered",
        budget={"resume_p99_s": budget, "min_recoveries": need},
        measured={
            "recoveries": n,
            "p50_s": finite_or_none(nearest_rank(values, 0.5)),
            "p90_s": finite_or_none(nearest_rank(values, 0.9)),
            "p99_s": finite_or_none(p99),
            "p99_unbounded": bool(math.isinf(p99)),
            "max_recovered_s": float(finite.max()) if len(finite) else None,
            "never_recovered": int((never & ~censored).sum()),
            "censored": int(censored.sum()),
            "calls_without_outcome": len(stuck),
            "by_end": {str(k): int(v) for k, v in counted["end_reason"].value_counts().items()},
            "outcomes_after_loss": {str(k): int(v) for k, v in counted["outcome"].value_counts().items()},
        },
        evidence=tuple(evidence),
        violations=len(slow) if failed else 0,
        witnesses=tuple(_witness(r, budget, ctx) for _, r in slow.head(ctx.witness_limit).iterrows())
        if failed
        else (),
        attribution_counts={"unattributed": len(slow)} if failed else {},
        truth_from=TRUTH_FROM,
    )


def _witness(r: pd.Series, budget: float, ctx: Context) -> Witness:
    latency = float(r["latency_s"])
    if math.isinf(latency):
        ended = (
            f"its outcome was `{r['outcome']}` {at(r['outcome_at'], ctx.origin)} with no message of the call "
            "delivered after the loss"
            if isinstance(r["outcome"], str)
            else "it never got an outcome"
        )
        took = f"never recovered: {ended}"
    else:
        took = f"the application next got a message of the call {latency:.3f} s later"
    text = (
        f"client {r['client_id']} lost a stream of call {r['call']} ({r['end_reason']}) {at(r['lost_at'], ctx.origin)}; "
        f"{took} (budget {budget:g} s)"
    )
    fields = row_of(
        r, ["client_id", "call", "flow", "end_reason", "lost_at", "recovered_at", "outcome", "outcome_at"]
    )
    fields["latency_s"] = None if math.isinf(latency) else latency
    logs = app_logs(ctx)
    refs = client_wire.ref(r) + app_ref(logs, {"_src": r["_src"], "_line": r["_app_line"]})
    return Witness("slow_recovery", text, Attribution.UNATTRIBUTED, fields, tuple(refs))
