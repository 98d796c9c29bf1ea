"""Gate 6 — reconnect QPS never above the budget, and every wait at least the advice.

One rule for any client; only where the attempts come from differs
(lab.checker.truth.reconnects): the lab's clients' `reconnects` ledgers, or, for a client
under test, its requests that get a stream or a session back as the tap saw them
(`resume`, `reopen`, `reinitialize`, `resend`: lab.checker.truth.client_wire `attempts`).

- `over_budget`: the attempts of every client, merged, in 1 s bins (bin = floor of the
  time sent, epoch seconds); each bin above reconnect_qps is a violation. The gate
  compares the busiest second (max) with the budget.
- `waited_less_than_advised`: an attempt sent sooner after the loss it answers than it
  was advised (the lab's clients: `advised_delay`, the SSE `retry` or `Retry-After`; on
  the wire: the `Retry-After` of a 429/503 answer to the previous attempt, else the last
  SSE `retry` on that stream), less a 1 ms allowance for float rounding of epoch times.

Both are attributed to the client (it is the client's budget and its waits). Evidence:
at least one attempt, and a reconnect budget in run.json.

- `close_without_retry` (server, from the tap: `lab.checker.truth.wire_streams`; the lab's
  clients' runs): the server ended a connection while its stream went on (a polling
  close) without an SSE `retry` field on it; the clients could not honour advice they
  were never given.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from lab.checker.context import Context
from lab.checker.explain import at, row_of
from lab.checker.model import Attribution, Evidence, GateResult, Witness, decide
from lab.checker.rules.base import Rule
from lab.checker.truth.reconnects import (
    WAIT_ALLOWANCE_S,
    Attempts,
    lab_attempts,
    over_budget,
    per_second,
    wire_attempts,
)
from lab.checker.truth.wire_streams import close_witness, closes_without_retry

TRUTH_FROM_WIRE = (
    "the wire (the proxy's record): resumptions, re-opened streams, re-initializations and re-sent calls"
)


def check(ctx: Context) -> GateResult:
    """The lab's clients: their ledgers, and the server's closes without `retry`."""
    unadvised, closes = closes_without_retry(ctx) if ctx.data.tap is not None else (pd.DataFrame(), 0)
    result = judge(ctx, lab_attempts(ctx), [*ctx.client_evidence()])
    witnesses = [close_witness(r, ctx) for _, r in unadvised.head(ctx.witness_limit).iterrows()]
    return replace(
        result,
        verdict=decide(result.violations + len(unadvised) > 0, result.evidence),
        summary=result.summary
        + (f"; {len(unadvised)} of {closes} server close(s) mid-stream without `retry`" if closes else ""),
        measured={
            **result.measured,
            "server_closes_mid_stream": closes,
            "close_without_retry": len(unadvised),
        },
        violations=result.violations + len(unadvised),
        witnesses=(*witnesses, *result.witnesses),
        attribution_counts={**result.attribution_counts, "server": len(unadvised)},
    )


def check_under_test(ctx: Context) -> GateResult:
    """A client under test: its attempts on the wire."""
    att = wire_attempts(ctx)
    result = judge(ctx, att, [])
    measured = {**result.measured, "clients_reconnecting": int(att.frame["client_id"].nunique())}
    return replace(result, measured=measured, truth_from=TRUTH_FROM_WIRE)


def judge(ctx: Context, attempts: Attempts, more_evidence: list[Evidence]) -> GateResult:
    """The attempts against the budget and their advice, whoever's clients they are."""
    att = attempts.frame
    budget = ctx.budgets.reconnect_qps
    counts = per_second(att["t"].to_numpy(dtype="float64"))
    peak = int(counts.max()) if len(counts) else 0
    over = over_budget(counts, budget)
    advised = att["advised_s"]
    early = att[advised.notna() & (att["waited_s"] + WAIT_ALLOWANCE_S < advised)].sort_values(
        "t", kind="stable"
    )
    shown_over = over.head(ctx.witness_limit)
    witnesses = [
        _over_witness(int(s), int(n), budget or 0.0, attempts, ctx)
        for s, n in zip(shown_over.index.tolist(), shown_over.tolist(), strict=True)
    ]
    witnesses += [_early_witness(r, attempts, ctx) for _, r in early.head(ctx.witness_limit).iterrows()]
    evidence = [
        ctx.events_evidence(),
        Evidence("reconnects", 1, len(att), len(att) >= 1, attempts.source, from_faults=True),
        Evidence(
            "reconnect budget", True, budget is not None, budget is not None, "run.json budgets.reconnect_qps"
        ),
        *more_evidence,
    ]
    violations = len(over) + len(early)
    shown = "none" if budget is None else f"{budget:g}/s"
    return GateResult(
        verdict=decide(violations > 0, evidence),
        summary=(
            f"peak {peak} reconnects/s (budget {shown}); {len(over)} second(s) over; "
            f"{len(early)} of {int(advised.notna().sum())} advised wait(s) cut short"
        ),
        budget={"reconnect_qps": budget},
        measured={
            "reconnects": len(att),
            "peak_per_s": peak,
            "seconds_over_budget": len(over),
            "waits_shorter_than_advised": len(early),
            "with_advice": int(advised.notna().sum()),
            "by_kind": {str(k): int(v) for k, v in att["kind"].value_counts().items()},
        },
        evidence=tuple(evidence),
        violations=violations,
        witnesses=tuple(witnesses),
        attribution_counts={"client": violations},
    )


def _over_witness(second: int, n: int, budget: float, attempts: Attempts, ctx: Context) -> Witness:
    att = attempts.frame
    inside = att[(att["t"] >= second) & (att["t"] < second + 1)]
    kinds = ", ".join(f"{k} {v}" for k, v in inside["kind"].value_counts().items())
    text = (
        f"{n} reconnect attempts from {inside['client_id'].nunique()} clients in the second starting "
        f"{at(second, ctx.origin)} ({kinds}); budget {budget:g}/s"
    )
    refs = [ref for _, row in inside.head(3).iterrows() for ref in attempts.refs(row)]
    fields = {
        "second": second,
        "attempts": n,
        "clients": int(inside["client_id"].nunique()),
        "budget": budget,
    }
    return Witness("over_budget", text, Attribution.CLIENT, fields, tuple(refs))


def _early_witness(r: pd.Series, attempts: Attempts, ctx: Context) -> Witness:
    what = f" {r['what']}" if r["what"] else ""
    text = (
        f"client {r['client_id']} sent a {r['kind']}{what} {at(r['t'], ctx.origin)}, "
        f"{float(r['waited_s']):.3f} s after the loss ({r['cause']}, {at(r['lost_at'], ctx.origin)}), "
        f"though it was advised to wait {float(r['advised_s']):.3f} s ({r['advice']})"
    )
    return Witness(
        "waited_less_than_advised",
        text,
        Attribution.CLIENT,
        row_of(r, list(attempts.fields)),
        tuple(attempts.refs(r)),
    )


RULE = Rule(
    id="reconnect_qps",
    number=6,
    title="Reconnects per second within the budget",
    blames=(Attribution.CLIENT, Attribution.SERVER),
    evidence="at least one reconnect, and a reconnect budget in run.json",
    check=check,
    check_under_test=check_under_test,
    budget_key="reconnect_qps",
    judged_to_knee=True,
)
