"""Gate 6 — reconnect QPS never above the budget, and every wait at least the advice.

- `over_budget`: the client `reconnects` of every worker, merged, counted in 1 s bins
  (bin = floor(sent_at), epoch seconds); each bin above reconnect_qps is a violation.
  The gate compares the busiest second (max) with the budget.
- `waited_less_than_advised`: a reconnect whose wait (sent_at - lost_at, s) is shorter
  than the delay the server advised (`advised_delay`: SSE `retry` or `Retry-After`, s),
  less a 1 ms allowance for float rounding of epoch times.

Both are attributed to the client (it is the client's budget and its waits). Evidence:
at least one reconnect, and a reconnect budget in run.json.

- `close_without_retry` (server, from the tap: `lab.checker.truth.wire_streams`): the server
  ended a connection while its stream went on (a polling close) without an SSE `retry`
  field on it; the clients could not honour advice they were never given.
"""

from __future__ import annotations

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, client_ref, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.rules.reconnect_sut import check as read_under_test
from lab.checker.truth.reconnects import WAIT_ALLOWANCE_S, over_budget, per_second
from lab.checker.truth.wire_streams import close_witness, closes_without_retry


def check(ctx: Context) -> GateResult:
    rc = ctx.require_client("reconnects")
    budget = ctx.budgets.reconnect_qps
    counts = per_second(rc)
    peak = int(counts.max()) if len(counts) else 0
    over = over_budget(counts, budget)
    waited = rc["sent_at"].astype("float64") - rc["lost_at"].astype("float64")
    advised = pd.to_numeric(rc["advised_delay"], errors="coerce")
    too_soon = advised.notna() & (waited + WAIT_ALLOWANCE_S < advised)
    early = rc[too_soon].assign(actual_wait=waited[too_soon])
    early = early.sort_values("sent_at", kind="stable")
    witnesses = [
        _over_witness(int(second), int(n), budget or 0.0, rc, ctx)
        for second, n in zip(
            over.head(ctx.witness_limit).index.tolist(), over.head(ctx.witness_limit).tolist(), strict=True
        )
    ]
    witnesses += [_early_witness(r, ctx) for _, r in early.head(ctx.witness_limit).iterrows()]
    unadvised, closes = closes_without_retry(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    witnesses = [close_witness(r, ctx) for _, r in unadvised.head(ctx.witness_limit).iterrows()] + witnesses
    evidence = [
        ctx.events_evidence(),
        Evidence("reconnects", 1, len(rc), len(rc) >= 1, "attempts in the client ledgers"),
        Evidence(
            "reconnect budget",
            True,
            budget is not None,
            budget is not None,
            "run.json budgets.reconnect_qps",
        ),
        *ctx.client_evidence(),
    ]
    violations = len(over) + len(early) + len(unadvised)
    shown_budget = "none" if budget is None else f"{budget:g}/s"
    return GateResult(
        verdict=decide(violations > 0, evidence),
        summary=(
            f"peak {peak} reconnects/s (budget {shown_budget}); {len(over)} second(s) over; "
            f"{len(early)} wait(s) shorter than advised"
            + (f"; {len(unadvised)} of {closes} server close(s) mid-stream without `retry`" if closes else "")
        ),
        budget={"reconnect_qps": budget},
        measured={
            "reconnects": len(rc),
            "peak_per_s": peak,
            "seconds_over_budget": len(over),
            "waits_shorter_than_advised": len(early),
            "with_advice": int(advised.notna().sum()),
            "by_kind": {str(k): int(v) for k, v in rc["kind"].value_counts().items()},
            "server_closes_mid_stream": closes,
            "close_without_retry": len(unadvised),
        },
        evidence=tuple(evidence),
        violations=violations,
        witnesses=tuple(witnesses),
        attribution_counts={"client": len(over) + len(early), "server": len(unadvised)},
    )


def _over_witness(second: int, n: int, budget: float, rc: pd.DataFrame, ctx: Context) -> Witness:
    sent = rc["sent_at"].astype("float64")
    inside = rc[(sent >= second) & (sent < second + 1)]
    kinds = ", ".join(f"{k} {v}" for k, v in inside["kind"].value_counts().items())
    text = (
        f"{n} reconnect attempts from {inside['client_id'].nunique()} clients in the second starting "
        f"{at(second, ctx.origin)} ({kinds}); budget {budget:g}/s"
    )
    refs = [
        r
        for _, row in inside.head(3).iterrows()
        for r in client_ref(ctx.data.client_files, "reconnects", row)
    ]
    return Witness(
        "over_budget",
        text,
        Attribution.CLIENT,
        {"second": second, "attempts": n, "clients": int(inside["client_id"].nunique()), "budget": budget},
        tuple(refs),
    )


def _early_witness(r: pd.Series, ctx: Context) -> Witness:
    text = (
        f"client {r['client_id']} sent a {r['kind']} of {r['stream_key']} {at(r['sent_at'], ctx.origin)}, "
        f"{float(r['actual_wait']):.3f} s after the loss ({r['cause']}), though the server advised waiting "
        f"{float(r['advised_delay']):.3f} s"
    )
    fields = row_of(
        r,
        [
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
        ],
    )
    refs = client_ref(ctx.data.client_files, "reconnects", r)
    return Witness("waited_less_than_advised", text, Attribution.CLIENT, fields, tuple(refs))


RULE = Rule(
    id="reconnect_qps",
    number=6,
    title="Reconnect QPS within the budget",
    blames=(Attribution.CLIENT, Attribution.SERVER),
    evidence="at least one reconnect, and a reconnect budget in run.json",
    check=check,
    check_under_test=read_under_test,
    budget_key="reconnect_qps",
    judged_to_knee=True,
)
