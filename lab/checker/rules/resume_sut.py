"""Gate 5 for a client under test — resume latency p99 (budget: resume_p99_s).

Each loss is seen on the wire (a stream of a call that ended before serving it whole,
lab.checker.truth.client_delivery `recoveries`); its recovery is the moment the application
next received a message the server sent on that call's streams (its response or a
progress notification), from the application log. A call lost and never answered again
before its outcome — or without any outcome by the end of the run — never recovered and
counts as infinitely slow, unless it was lost less than resume_p99_s before the run
stopped (censored: left out and counted). Calls the wire shows that never got an
outcome at all are listed in the measures (`calls_without_outcome`).

p99 is the nearest-rank percentile (lab.checker.rules.resume). The client is judged on
its own share of each recovery, timed at the wire (lab.checker.truth.sut_shares: its waits
beyond what it was advised), where a recovery can be split, and on the whole latency
where it cannot; a total over the budget that the client's share does not explain is the
target's or the lab's: inconclusive, never a failure of the client (the one rule,
lab.checker.truth.shares `judge_share`). Witnesses: the slowest recoveries in what was
judged (never-recovered first), the client's where its share is what is slow.
Evidence: recoveries (censored excluded) >= min_recoveries.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, finite_or_none, row_of
from lab.checker.model import Attribution, Evidence, GateResult, JsonValue, Verdict, Witness, decide
from lab.checker.truth import client_wire
from lab.checker.truth.applog import app_logs, app_ref
from lab.checker.truth.recoveries import PERCENTILE, nearest_rank
from lab.checker.truth.shares import SHARES, ShareFigures, judge_share, share_figures
from lab.checker.truth.sut_shares import sut_recovery_shares

TRUTH_FROM = "losses from the wire (the proxy's record), recoveries from the application log"


def calls_without_outcome(ctx: Context) -> pd.DataFrame:
    """Calls the wire shows (a tools/call POST with the call's key) with no outcome in any
    application log: client_id, call, first seen (t_req)."""
    flows = client_wire.flows(ctx)
    posts = flows[(flows["rpc_method"] == "tools/call") & flows["key"].notna()]
    first = posts.drop_duplicates("key").rename(columns={"key": "call"})
    done = set(app_logs(ctx).of("outcome")["call"].tolist())
    return first[~first["call"].isin(done)][["client_id", "call", "t_req", "tap_line"]]


def check(ctx: Context) -> GateResult:
    rec = sut_recovery_shares(ctx)
    budget = ctx.budgets.resume_p99_s
    stopped = ctx.stopped_at
    never = rec["recovered_at"].isna()
    censored = never & (stopped is not None) & (rec["lost_at"] + budget > (stopped or 0.0))
    counted = rec[~censored].copy()
    values = counted["latency_s"].to_numpy(dtype="float64")
    p99 = nearest_rank(values, PERCENTILE)
    n = len(counted)
    need = max(1, ctx.budgets.min_recoveries)
    # The client's share where the recovery was split, else the whole latency.
    counted["judged_s"] = counted["client_s"].astype("float64").fillna(counted["latency_s"].astype("float64"))
    client_p99 = nearest_rank(counted["judged_s"].to_numpy(dtype="float64"), PERCENTILE)
    figures = share_figures(counted, total="latency_s")
    judged = judge_share(p99, client_p99, budget, share="client", rest="the target or the lab")
    failed = n > 0 and judged.failed
    slow = counted[counted["judged_s"] >= budget].sort_values("judged_s", ascending=False, kind="stable")
    finite = values[np.isfinite(values)]
    stuck = calls_without_outcome(ctx)
    evidence = [
        ctx.events_evidence(),
        Evidence(
            "recoveries",
            need,
            n,
            n >= need,
            "losses of a call's stream on the wire (those too recent to judge when the run stopped left out)",
            from_faults=True,
        ),
    ]
    p99_text = "n/a" if n == 0 else ("never" if math.isinf(p99) else f"{p99:.3f} s")
    summary = (
        f"p99 {p99_text} over {n} recoveries (budget < {budget:g} s); {int(never.sum())} never recovered"
    )
    verdict = decide(failed, evidence)
    if n and judged.limited_by_lab and verdict is Verdict.PASS:
        verdict = Verdict.INCONCLUSIVE
    if n and (judged.limited_by_lab or failed):
        summary += f"; {judged.text}"
    return GateResult(
        verdict=verdict,
        summary=summary,
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
            "judged_on": "client's share" if figures["client"].n else "total",
            "shares": _shares_json(figures),
        },
        evidence=tuple(evidence),
        violations=len(slow) if failed else 0,
        witnesses=tuple(_witness(r, budget, ctx) for _, r in slow.head(ctx.witness_limit).iterrows())
        if failed
        else (),
        attribution_counts=_blame_counts(slow) if failed else {},
        truth_from=TRUTH_FROM,
        notes=(f"judged on the client's share: {judged.text}; {_shares_text(figures)}",)
        if figures["client"].n
        else (),
    )


def _blame_counts(slow: pd.DataFrame) -> dict[str, int]:
    known = int(slow["client_s"].notna().sum())
    out = {"client": known} if known else {}
    if len(slow) - known:
        out["unattributed"] = len(slow) - known
    return out


def _shares_json(figures: dict[str, ShareFigures]) -> JsonValue:
    return {
        name: {
            "recoveries": f.n,
            "p50_s": finite_or_none(f.p50_s),
            "p99_s": finite_or_none(f.p99_s),
            "p99_unbounded": bool(math.isinf(f.p99_s)),
        }
        for name, f in figures.items()
    }


def _shares_text(figures: dict[str, ShareFigures]) -> str:
    def shown(v: float) -> str:
        return "never" if math.isinf(v) else ("n/a" if math.isnan(v) else f"{v:.3f} s")

    parts = [
        f"{name} p50 {shown(figures[name].p50_s)} / p99 {shown(figures[name].p99_s)}"
        for name in ("total", *SHARES)
    ]
    return "; ".join(parts) + f" (over {figures['total'].n} recoveries split)"


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
    shares = [float(r.get(f"{k}_s", math.nan)) for k in SHARES]
    if not any(math.isnan(v) for v in shares):
        took += "; " + ", ".join(
            f"{k}'s share {'never' if math.isinf(v) else f'{v:.3f} s'}"
            for k, v in zip(SHARES, shares, strict=True)
        )
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
    client_share = r.get("client_s")
    blame = (
        Attribution.CLIENT
        if isinstance(client_share, float) and not math.isnan(client_share)
        else Attribution.UNATTRIBUTED
    )
    return Witness("slow_recovery", text, blame, fields, tuple(refs))
